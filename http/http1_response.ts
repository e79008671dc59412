/**
 * Writing an answer on an HTTP/1.1 connection of http/http1_server.ts: the status line, the
 * headers (hop-by-hop ones dropped, a `Date` added), and the body with its `Content-Length` (a
 * small declared one, or a stream that has already ended, in one write with the head) or chunked
 * (a stream still coming, such as live output).
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import type { RequestHead } from "./http1_head.ts";

const _BODY_CHUNK = 64 * 1024;
const _encoder = new TextEncoder();
const _TIMEOUT = Symbol("timeout");
const _HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade"]);

/**
 * Writes `response` to `conn` for a request with `head`; whether it was written whole (false:
 * the connection failed, or the body did; the connection must close).
 */
export async function writeResponse(
  conn: Deno.Conn,
  head: RequestHead,
  response: Response,
  keepAlive: boolean,
): Promise<boolean> {
  const status = response.status;
  let lines = `HTTP/1.1 ${status} ${reasonPhrase(status)}\r\n`;
  const seen = { length: null as string | null, date: false };
  response.headers.forEach((value, name) => {
    if (_HOP_BY_HOP.has(name)) return;
    if (name === "content-length") seen.length = value;
    else if (name === "date") seen.date = true;
    lines += `${name}: ${value}\r\n`;
  });
  const declared = seen.length;
  if (!seen.date) lines += `date: ${httpDate()}\r\n`;
  if (!keepAlive) lines += "connection: close\r\n";
  const bodyless = head.method === "HEAD" || status === 204 || status === 304 || status < 200;
  if (!bodyless && declared !== null && Number(declared) <= _BODY_CHUNK) {
    // A small answer of declared length: its bytes (a string's or bytes' without a stream).
    try {
      const bytes = await response.bytes();
      await writeAll(conn, concatBytes([_encoder.encode(`${lines}\r\n`), bytes]));
      return bytes.length === Number(declared);
    } catch {
      return false;
    }
  }
  const body = response.body;
  if (bodyless || !body) {
    await body?.cancel().catch(() => {});
    if (declared === null && !bodyless) lines += "content-length: 0\r\n";
    return await writeAll(conn, _encoder.encode(`${lines}\r\n`)).then(() => true, () => false);
  }
  const reader = body.getReader();
  let ok = false;
  try {
    let first: ReadableStreamReadResult<Uint8Array> = await reader.read();
    if (declared === null) {
      // A body whose stream has already ended (a string or bytes) goes with its length; one
      // still coming (live output) chunked.
      const chunks: Uint8Array[] = [];
      while (!first.done) {
        chunks.push(first.value);
        const next = reader.read();
        const settled = await Promise.race([next, _macrotask()]);
        if (settled === _TIMEOUT) {
          first = { done: false, value: concatBytes(chunks) };
          chunks.length = 0;
          ok = await _writeChunked(conn, lines, first.value, reader, next);
          return ok;
        }
        first = settled as ReadableStreamReadResult<Uint8Array>;
      }
      const bytes = chunks.length === 1 ? chunks[0] : concatBytes(chunks);
      lines += `content-length: ${bytes.length}\r\n\r\n`;
      await writeAll(conn, concatBytes([_encoder.encode(lines), bytes]));
      ok = true;
      return ok;
    }
    const length = Number(declared);
    let sent = 0;
    const headBytes = _encoder.encode(`${lines}\r\n`);
    if (!first.done && first.value.length <= _BODY_CHUNK) {
      await writeAll(conn, concatBytes([headBytes, first.value]));
      sent += first.value.length;
      first = await reader.read();
    } else await writeAll(conn, headBytes);
    while (!first.done) {
      await writeAll(conn, first.value);
      sent += first.value.length;
      first = await reader.read();
    }
    ok = sent === length;
    return ok;
  } catch {
    return false;
  } finally {
    if (!ok) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

async function _writeChunked(
  conn: Deno.Conn,
  lines: string,
  first: Uint8Array,
  reader: ReadableStreamDefaultReader<Uint8Array>,
  pending: Promise<ReadableStreamReadResult<Uint8Array>>,
): Promise<boolean> {
  await writeAll(
    conn,
    concatBytes([_encoder.encode(`${lines}transfer-encoding: chunked\r\n\r\n`), _chunk(first)]),
  );
  for (let next = await pending; !next.done; next = await reader.read()) {
    if (next.value.length > 0) await writeAll(conn, _chunk(next.value));
  }
  await writeAll(conn, _encoder.encode("0\r\n\r\n"));
  return true;
}

function _chunk(bytes: Uint8Array): Uint8Array {
  if (bytes.length === 0) return bytes;
  return concatBytes([_encoder.encode(`${bytes.length.toString(16)}\r\n`), bytes, _CRLF]);
}

const _CRLF = _encoder.encode("\r\n");

/** Writes all of `bytes` to `conn`. */
export async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let offset = 0; offset < bytes.length;) offset += await conn.write(bytes.subarray(offset));
}

/** Resolves with {@linkcode _TIMEOUT} after the microtasks already queued have run. */
function _macrotask(): Promise<typeof _TIMEOUT> {
  return new Promise((resolve) => setTimeout(() => resolve(_TIMEOUT), 0));
}

let _dateSecond = 0;
let _dateText = "";

/** The `Date` header's value (RFC 9110 §5.6.7), made once a second. */
export function httpDate(): string {
  const second = Math.floor(Date.now() / 1000);
  if (second !== _dateSecond) {
    _dateSecond = second;
    _dateText = new Date(second * 1000).toUTCString();
  }
  return _dateText;
}

const _REASONS: Record<number, string> = {
  100: "Continue",
  200: "OK",
  204: "No Content",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  413: "Content Too Large",
  426: "Upgrade Required",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
  505: "HTTP Version Not Supported",
};

/** The reason phrase of `status`. */
export function reasonPhrase(status: number): string {
  return _REASONS[status] ?? "Unknown";
}
