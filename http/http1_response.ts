/**
 * Writing an answer on an HTTP/1.1 connection: status line, headers (hop-by-hop dropped, `Date`
 * added), and the body with `Content-Length` (one write with the head when small or already ended)
 * or chunked. Each chunk is written before the next is read: a stream may reuse a chunk's memory
 * once the next is asked for (the Router's streamed answers do).
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import type { RequestHead } from "./http1_head.ts";
import { wholeBody } from "./whole_body.ts";

const _BODY_CHUNK = 64 * 1024;
const _encoder = new TextEncoder();
const _TIMEOUT = Symbol("timeout");
const _HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade"]);

/** Header fields to write one line each, for answers made by {@linkcode withFieldLines}. */
const _fieldLines = new WeakMap<Response, readonly [string, string][]>();

/**
 * `response` with its header fields written as `fields` has them, one line each in their order,
 * where its `Headers` would join a repeated name into one line (`a: 1, 2`): for an answer that
 * passes on fields of another (the Router's answers from a node). `fields` are the entries
 * `response`'s headers were made from.
 */
export function withFieldLines(response: Response, fields: readonly [string, string][]): Response {
  _fieldLines.set(response, fields);
  return response;
}

/**
 * A `Response` of `body` (bytes or a stream: no content type of its own) and `status` whose header
 * fields are `fields`, kept for {@linkcode withFieldLines} (one line each). Its `Headers` are filled
 * once it is made, not by its init: a `Response` made with bytes or text and two or more header fields has Deno build a
 * native answer for `Deno.serve` beside it, which this writer never uses and which is freed only
 * after a garbage collection (about 6 µs per answer in a loop). Invalid fields throw a `TypeError`,
 * as in the init.
 *
 * @example
 * ```ts
 * import { fieldLinesResponse } from "./http1_response.ts";
 *
 * const fields: [string, string][] = [["set-cookie", "a=1"], ["x-a", "1"], ["x-a", "2"]];
 * const response = fieldLinesResponse(new TextEncoder().encode("ok"), 201, fields);
 * if (response.status !== 201 || response.headers.get("x-a") !== "1, 2") throw new Error();
 * if ((await response.text()) !== "ok") throw new Error();
 * ```
 */
export function fieldLinesResponse(
  body: Uint8Array<ArrayBuffer> | ReadableStream<Uint8Array> | null,
  status: number,
  fields: readonly [string, string][],
): Response {
  const response = new Response(body, { status });
  const headers = response.headers;
  for (const [name, value] of fields) headers.append(name, value);
  _fieldLines.set(response, fields);
  return response;
}

/**
 * Writes `response` to `conn` for a request with `head`; whether it was written whole (false: the
 * connection failed, or the body did; the connection must close). Once `gone` aborts (the client's
 * end came), a body still streaming is cancelled: its stream's `cancel` tells its maker, and
 * nothing more is written.
 */
export async function writeResponse(
  conn: Deno.Conn,
  head: RequestHead,
  response: Response,
  keepAlive: boolean,
  gone?: AbortSignal,
): Promise<boolean> {
  const status = response.status;
  let lines = `HTTP/1.1 ${status} ${reasonPhrase(status)}\r\n`;
  const seen = { length: null as string | null, date: false, chunked: false };
  const field = (value: string, name: string) => {
    if (name === "transfer-encoding") seen.chunked = value.toLowerCase() === "chunked";
    if (_HOP_BY_HOP.has(name)) return;
    if (name === "content-length") seen.length = value;
    else if (name === "date") seen.date = true;
    lines += `${name}: ${value}\r\n`;
  };
  const fields = _fieldLines.get(response);
  if (!fields) response.headers.forEach(field);
  else for (const [name, value] of fields) field(value, name.toLowerCase());
  const declared = seen.length;
  if (!seen.date) lines += `date: ${httpDate()}\r\n`;
  if (!keepAlive) lines += "connection: close\r\n";
  const bodyless = head.method === "HEAD" || status === 204 || status === 304 || status < 200;
  const whole = bodyless ? undefined : wholeBody(response);
  if (whole && (declared === null || Number(declared) === whole.length)) {
    // Bytes kept whole beside the answer: with their length, in one write with the head.
    if (declared === null) lines += `content-length: ${whole.length}\r\n`;
    return await writeAll(conn, concatBytes([_encoder.encode(`${lines}\r\n`), whole]))
      .then(() => true, () => false);
  }
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
  const cancel = () => void reader.cancel(gone?.reason).catch(() => {});
  gone?.addEventListener("abort", cancel, { once: true });
  try {
    if (gone?.aborted) return false;
    if (declared === null && seen.chunked) {
      // The head at once: a stream that fails before its first chunk is an answer cut short.
      ok = await _writeChunked(conn, lines, _EMPTY, reader, null, gone);
      return ok;
    }
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
          ok = await _writeChunked(conn, lines, first.value, reader, next, gone);
          return ok;
        }
        first = settled as ReadableStreamReadResult<Uint8Array>;
      }
      if (gone?.aborted) return false;
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
    gone?.removeEventListener("abort", cancel);
    if (!ok) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/**
 * The head and `first` chunk, then the rest of `reader` chunked: `pending`, a read already begun,
 * else each read only once the chunk before it is written; false once `gone` aborted (the reader
 * cancelled: its end is no answer's end).
 */
async function _writeChunked(
  conn: Deno.Conn,
  lines: string,
  first: Uint8Array,
  reader: ReadableStreamDefaultReader<Uint8Array>,
  pending: Promise<ReadableStreamReadResult<Uint8Array>> | null,
  gone: AbortSignal | undefined,
): Promise<boolean> {
  await writeAll(
    conn,
    concatBytes([_encoder.encode(`${lines}transfer-encoding: chunked\r\n\r\n`), _chunk(first)]),
  );
  // A large chunk is not copied: its size line, then its bytes; its CRLF goes with what follows.
  let crlfOwed = false;
  for (let next = await (pending ?? reader.read()); !next.done; next = await reader.read()) {
    const bytes = next.value;
    if (bytes.length === 0) continue;
    const lead = crlfOwed ? "\r\n" : "";
    if (bytes.length < _BODY_CHUNK) {
      await writeAll(conn, crlfOwed ? concatBytes([_CRLF, _chunk(bytes)]) : _chunk(bytes));
      crlfOwed = false;
    } else {
      await writeAll(conn, _encoder.encode(`${lead}${bytes.length.toString(16)}\r\n`));
      await writeAll(conn, bytes);
      crlfOwed = true;
    }
  }
  if (gone?.aborted) return false;
  await writeAll(conn, crlfOwed ? concatBytes([_CRLF, _LAST_CHUNK]) : _LAST_CHUNK);
  return true;
}

function _chunk(bytes: Uint8Array): Uint8Array {
  if (bytes.length === 0) return bytes;
  return concatBytes([_encoder.encode(`${bytes.length.toString(16)}\r\n`), bytes, _CRLF]);
}

const _EMPTY = new Uint8Array(0);
const _LAST_CHUNK = _encoder.encode("0\r\n\r\n");

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
