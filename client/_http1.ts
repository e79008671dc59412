// A small HTTP/1.1 client over `Deno.connect`, used for plain-HTTP servers reached without a
// proxy. It exists for speed: `fetch` copies a request body before sending it and hands a
// response to JavaScript in small chunks, which made a 64 MiB tensor cost several times the
// time of the wire (measured on the H200 host: 128 MiB upload 245 ms with fetch, ~100 ms
// here; 64 MiB download 129 ms with fetch, ~50 ms here). Bodies are written straight from the
// caller's buffers and a response with a Content-Length is read straight into one buffer.
//
// Scope: one request at a time per connection, keep-alive connections pooled, Content-Length
// and chunked response bodies (or read-to-close), 1xx interim responses skipped. HTTPS and
// proxies stay with `fetch`.

import { concatBytes } from "../protocol/bytes.ts";
import { DelimiterFinder } from "../protocol/multipart.ts";

/** A complete response. */
export interface Http1Response {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/** Where to connect and how long a connection attempt may take. */
export interface Http1Target {
  hostname: string;
  port: number;
  /** The `Host` header value (host and, when not the default, port). */
  host: string;
  /** `null`: no limit. */
  connectTimeoutMs: number | null;
  /** Idle connections older than this are not reused (default 4000 ms; see `_IDLE_REUSE_MS`). */
  idleReuseMs?: number;
}

/**
 * Watches a Content-Length response body as it arrives: `pad` picks how many bytes to leave in
 * front of the body buffer (to align a payload inside it), `update` sees each new stretch.
 */
export interface BodyObserver {
  /** Bytes of padding before the body, given the first bytes of the body. */
  pad(prefix: Uint8Array): number;
  /** `body[0, received)` has arrived (reading goes on once a returned promise resolves). */
  update(body: Uint8Array, received: number): void | Promise<void>;
}

/** The connection could not be opened (the message names the host and the cause). */
export class Http1ConnectError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "Http1ConnectError";
  }
}

/**
 * Nothing of a response arrived. On a reused idle connection the request is retried once if it
 * cannot have run: it is idempotent (GET, HEAD), or it was not all sent (`sent` false).
 */
class _NothingReceived extends Error {
  /** The whole request had been written when the connection ended. */
  sent = false;
}

const _HEAD_LIMIT = 64 * 1024;
const _PREFIX_BYTES = 16 * 1024;
const _STEP = 2 * 1024 * 1024;
const _REFUSED_RETRY_MS = 100;
const _FIRST_READ = 16 * 1024;
const _SMALL_BODY = 64 * 1024;
/** A Content-Length body this large makes the next request prepare a touched buffer. */
const _PREFAULT_MIN = 8 * 1024 * 1024;
/** The prepared buffer exceeds the last body by this much (the JSON part's length varies). */
const _PREFAULT_SLACK = 64 * 1024;
/**
 * Pages are touched this many bytes at a time, yielding to the event loop in between (an
 * answer waits for at most one slice: ~0.15 ms on the H200 VM).
 */
const _PREFAULT_SLICE = 256 * 1024;
/** Responses that are not large before the expectation of a large one is dropped. */
const _PREFAULT_KEEP = 2;
/**
 * Idle connections older than this are closed, not reused: below the keep-alive timeout of
 * common servers (uvicorn's 5 s), so a request never races the server closing its connection
 * (which a POST, fully sent, could not be retried after).
 */
const _IDLE_REUSE_MS = 4000;
const _decoder = new TextDecoder("latin1");

/**
 * An idle keep-alive connection. A read is always pending on it (unref'd: it never keeps the
 * process alive), so a connection the server closes, or one that receives anything unasked, is
 * dropped from the pool at once instead of failing the next request; that read's buffer and
 * result become the first read of the next response.
 */
interface _Idle {
  conn: Deno.TcpConn;
  buffer: Uint8Array;
  read: Promise<number | null | Error>;
  /** When it was parked (`performance.now()`). */
  since: number;
}

/** A pool of keep-alive connections to one server. */
export class Http1Agent {
  readonly #target: Http1Target;
  #idle: _Idle[] = [];
  #closed = false;
  #lastLargeBody = 0;
  /** A request is preparing a buffer for an answer as large as the last large one. */
  #preparing = false;
  #smallSinceLarge = 0;
  #prefaultHits = 0;

  /** An agent for `target`; connections open on first use. */
  constructor(target: Http1Target) {
    this.#target = target;
  }

  /** Closes idle connections; requests in flight finish, then close theirs. */
  close(): void {
    this.#closed = true;
    for (const idle of this.#idle.splice(0)) _closeQuietly(idle.conn);
  }

  /** Idle pooled connections (for tests and diagnostics). */
  get idleConnections(): number {
    return this.#idle.length;
  }

  /** Responses read into a buffer prepared while waiting (for tests and diagnostics). */
  get prefaultedResponses(): number {
    return this.#prefaultHits;
  }

  #park(conn: Deno.TcpConn): void {
    const buffer = new Uint8Array(_FIRST_READ);
    conn.unref();
    const read = conn.read(buffer).catch((error: Error) => error);
    const idle: _Idle = { conn, buffer, read, since: performance.now() };
    this.#idle.push(idle);
    read.then(() => {
      // Anything while idle (the server closing it, an error, stray bytes) ends it.
      const index = this.#idle.indexOf(idle);
      if (index < 0) return; // taken by a request: the result is that response's first read
      this.#idle.splice(index, 1);
      _closeQuietly(conn);
    });
  }

  #take(): _Idle | undefined {
    const now = performance.now();
    for (;;) {
      const idle = this.#idle.pop();
      if (!idle) return undefined;
      if (now - idle.since > (this.#target.idleReuseMs ?? _IDLE_REUSE_MS)) {
        _closeQuietly(idle.conn); // its server may be closing it right now
        continue;
      }
      idle.conn.ref();
      return idle;
    }
  }

  /** Sends one request and reads its whole response. */
  async request(
    method: string,
    target: string,
    headers: Headers,
    body: readonly Uint8Array[] = [],
    observe?: (headers: Headers) => BodyObserver | undefined,
    signal?: AbortSignal,
  ): Promise<Http1Response> {
    signal?.throwIfAborted();
    let length = 0;
    for (const chunk of body) length += chunk.length;
    let head = `${method} ${target} HTTP/1.1\r\nhost: ${this.#target.host}\r\n`;
    for (const [name, value] of headers) {
      if (name !== "host" && name !== "content-length" && name !== "connection") {
        head += `${name}: ${value}\r\n`;
      }
    }
    if (length > 0 || method === "POST" || method === "PUT") {
      head += `content-length: ${length}\r\n`;
    }
    head += "\r\n";
    // Header values are byte strings (read as latin1): one byte per character, so a value echoed
    // from a response (X-KCoral-Node) goes back with the very bytes it came with.
    const headBytes = new Uint8Array(head.length);
    for (let i = 0; i < head.length; i++) headBytes[i] = head.charCodeAt(i);
    const pieces = length <= _SMALL_BODY
      ? [concatBytes([headBytes, ...body])] // one write, one packet
      : [headBytes, ...body];
    for (let attempt = 0;; attempt++) {
      // The retry always opens a new connection: another pooled one may be just as stale.
      const pooled = attempt === 0 ? this.#take() : undefined;
      const conn = pooled?.conn ?? await connectTcp(this.#target, signal);
      // Aborting closes the connection: whatever is pending on it fails at once.
      const abort = () => _closeQuietly(conn);
      signal?.addEventListener("abort", abort, { once: true });
      if (signal?.aborted) abort(); // aborted while connecting: the listener came too late
      // After a large response the next one is likely as large (the same program again): one
      // request at a time prepares a buffer for it (each of many concurrent ones would hold one).
      const prepare = this.#preparing ? 0 : this.#lastLargeBody;
      if (prepare > 0) this.#preparing = true;
      try {
        const { response, reusable, allocated } = await _exchange(
          conn,
          pieces,
          method,
          observe,
          pooled,
          prepare,
        ).finally(() => {
          if (prepare > 0) this.#preparing = false;
        });
        if (allocated.prefaulted) this.#prefaultHits++;
        if (allocated.bytes >= _PREFAULT_MIN) {
          this.#lastLargeBody = allocated.bytes;
          this.#smallSinceLarge = 0;
        } else if (++this.#smallSinceLarge >= _PREFAULT_KEEP) {
          // A small answer in between is expected (a CACHE_MISS before the resend); two end it.
          this.#lastLargeBody = 0;
        }
        if (reusable && !this.#closed) this.#park(conn);
        else _closeQuietly(conn);
        return response;
      } catch (error) {
        _closeQuietly(conn);
        signal?.throwIfAborted();
        // A server may close an idle keep-alive connection just as a request is sent on it
        // (closings noticed earlier never get here): the request goes again on a new connection
        // if it cannot have run. A POST that was all sent may have (the server can take it,
        // run it and drop the connection): that is the caller's TransportError, never a rerun.
        if (
          pooled && attempt === 0 && error instanceof _NothingReceived &&
          (method === "GET" || method === "HEAD" || !error.sent)
        ) continue;
        throw error instanceof _NothingReceived
          ? new Error("the server closed the connection without answering", { cause: error.cause })
          : error;
      } finally {
        signal?.removeEventListener("abort", abort);
      }
    }
  }
}

/**
 * Opens a TCP connection to `target` within its `connectTimeoutMs` (an
 * {@linkcode Http1ConnectError} naming the host otherwise); a refusal is tried once more after
 * 100 ms unless `retryRefused` is false. Aborting `abort` rejects with its reason.
 */
export async function connectTcp(
  target: Pick<Http1Target, "hostname" | "port" | "connectTimeoutMs">,
  abort?: AbortSignal,
  retryRefused = true,
): Promise<Deno.TcpConn> {
  const { hostname, port, connectTimeoutMs } = target;
  const timeout = connectTimeoutMs === null ? undefined : AbortSignal.timeout(connectTimeoutMs);
  const signal = abort && timeout ? AbortSignal.any([abort, timeout]) : abort ?? timeout;
  try {
    let conn: Deno.TcpConn;
    try {
      conn = await Deno.connect({ hostname, port, signal });
    } catch (error) {
      // A refusal can be momentary (a loaded or restarting server): one more try shortly.
      if (
        !retryRefused || !(error instanceof Deno.errors.ConnectionRefused) || signal?.aborted
      ) throw error;
      await new Promise((resolve) => setTimeout(resolve, _REFUSED_RETRY_MS));
      conn = await Deno.connect({ hostname, port, signal });
    }
    conn.setNoDelay(true);
    return conn;
  } catch (error) {
    abort?.throwIfAborted();
    if (timeout?.aborted) {
      throw new Http1ConnectError(
        `timed out connecting to ${hostname}:${port} after ${connectTimeoutMs! / 1000} s`,
        { cause: error },
      );
    }
    throw new Http1ConnectError(
      `cannot connect to ${hostname}:${port}: ${(error as Error).message}`,
      { cause: error },
    );
  }
}

async function _exchange(
  conn: Deno.TcpConn,
  pieces: Uint8Array[],
  method: string,
  observe: ((headers: Headers) => BodyObserver | undefined) | undefined,
  pooled: _Idle | undefined,
  expectedBody: number,
): Promise<{ response: Http1Response; reusable: boolean; allocated: _Allocation }> {
  // The body is written while the response is read: a server may answer early (413) without
  // reading the rest, and that answer must not be lost behind a blocked write.
  let written = false;
  let writeFailed = false;
  // Once the request is out, a buffer of the expected answer's size is touched while waiting.
  let spare: _Prefault | null = null;
  const writing = (async () => {
    try {
      for (const piece of pieces) await _writeAll(conn, piece);
      written = true;
      if (expectedBody > 0) spare = new _Prefault(expectedBody + _PREFAULT_SLACK);
    } catch {
      writeFailed = true;
    }
  })();
  const reader = new _Reader(conn, pooled, (total) => spare?.take(total) ?? null);
  let parsed;
  try {
    parsed = await _readResponse(reader, method, observe);
  } catch (error) {
    _closeQuietly(conn);
    await writing;
    if (error instanceof _NothingReceived) error.sent = written && !writeFailed;
    throw error;
  } finally {
    (spare as _Prefault | null)?.stop();
  }
  if (!written) {
    _closeQuietly(conn); // the server answered without taking the whole body
    await writing;
  }
  return {
    response: parsed.response,
    reusable: written && !writeFailed && parsed.keepAlive && reader.drained,
    allocated: reader.allocated,
  };
}

/** The buffer a Content-Length body was read into: its size (padding included), and whether it
 * was prepared in advance. */
interface _Allocation {
  bytes: number;
  prefaulted: boolean;
}

/**
 * A buffer whose pages are touched in the background (slices, yielding to the event loop in
 * between), so the response read into it does not fault them in as the bytes arrive: on the H200
 * VM fresh memory costs ~0.6 ms per MiB to touch, half of what receiving 64 MiB takes.
 */
export class _Prefault {
  readonly #buffer: Uint8Array;
  #stopped = false;
  #touched = 0;

  constructor(size: number) {
    this.#buffer = new Uint8Array(size);
    void this.#touch();
  }

  /** The buffer for a body of `total` bytes if it fits without waste (touching stops). */
  take(total: number): Uint8Array | null {
    this.stop();
    const size = this.#buffer.length;
    return size >= total && size - total <= 2 * _PREFAULT_SLACK ? this.#buffer : null;
  }

  stop(): void {
    this.#stopped = true;
  }

  /** Bytes touched so far. */
  get touched(): number {
    return this.#touched;
  }

  async #touch(): Promise<void> {
    for (let at = 0; at < this.#buffer.length && !this.#stopped; at += _PREFAULT_SLICE) {
      this.#buffer.fill(0, at, at + _PREFAULT_SLICE); // a write faults each page in
      this.#touched = Math.min(this.#buffer.length, at + _PREFAULT_SLICE);
      await _yieldToIo();
    }
  }
}

const _NOTHING = new Uint8Array(0);

/**
 * Lets pending I/O (the socket read of the answer) run before the next slice. It must pass
 * through the event loop's poll phase: a MessagePort message does not (Deno delivers messages
 * ahead of socket reads, so a loop of them held a waiting answer back until all 64 MiB were
 * touched), and timers are clamped to ~2 ms. The smallest async op that needs no permission
 * does it in ~10 µs.
 */
async function _yieldToIo(): Promise<void> {
  await crypto.subtle.digest("SHA-256", _NOTHING);
}

async function _writeAll(conn: Deno.TcpConn, bytes: Uint8Array): Promise<void> {
  let view = bytes;
  while (view.length > 0) view = view.subarray(await conn.write(view));
}

async function _readResponse(
  reader: _Reader,
  method: string,
  observe?: (headers: Headers) => BodyObserver | undefined,
): Promise<{ response: Http1Response; keepAlive: boolean }> {
  for (;;) {
    const head = await reader.readHead();
    const lines = _decoder.decode(head).split("\r\n");
    const match = /^HTTP\/1\.([01]) (\d{3})(?: .*)?$/.exec(lines[0]);
    if (!match) throw new Error(`malformed HTTP status line: ${JSON.stringify(lines[0])}`);
    const minor = match[1];
    const status = Number(match[2]);
    const headers = new Headers();
    for (const line of lines.slice(1)) {
      if (line === "") continue;
      const colon = line.indexOf(":");
      if (colon <= 0 || /^[ \t]/.test(line)) {
        throw new Error(`malformed HTTP header line: ${JSON.stringify(line)}`);
      }
      headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
    }
    // Interim answers (100 Continue, 103 Early Hints) come before the real one; 101 Switching
    // Protocols is final (nothing asked for it): a non-200 answer like any other.
    if (status >= 100 && status < 200 && status !== 101) continue;
    const connection = (headers.get("connection") ?? "").toLowerCase();
    // A connection that switched protocols (101) is no longer HTTP/1.1: never reused.
    let keepAlive = status !== 101 &&
      (minor === "1" ? !/\bclose\b/.test(connection) : /\bkeep-alive\b/.test(connection));
    let body: Uint8Array;
    const encoding = (headers.get("transfer-encoding") ?? "").toLowerCase().trim();
    const lengthHeader = headers.get("content-length");
    if (method === "HEAD" || status === 101 || status === 204 || status === 304) {
      body = new Uint8Array(0);
    } else if (encoding !== "") {
      // Only chunked, alone: a coding under it (gzip, chunked) is not decoded here.
      if (encoding !== "chunked") {
        throw new Error(`unsupported transfer-encoding: ${encoding}`);
      }
      body = await reader.readChunked();
    } else if (lengthHeader !== null) {
      const values = new Set(lengthHeader.split(",").map((v) => v.trim()));
      const [value] = values;
      if (values.size !== 1 || !/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) {
        throw new Error(`malformed content-length: ${JSON.stringify(lengthHeader)}`);
      }
      body = await reader.readExact(Number(value), observe?.(headers));
    } else {
      body = await reader.readToEnd();
      keepAlive = false;
    }
    return { response: { status, headers, body }, keepAlive };
  }
}

/** Buffered reads from a connection; large bodies are read straight into their buffer. */
class _Reader {
  readonly #conn: Deno.TcpConn;
  #buffer: Uint8Array;
  /** A read begun while the connection was idle (into `#buffer`): the first one to use. */
  #first: Promise<number | null | Error> | null;
  #start = 0;
  #end = 0;
  #received = false;

  readonly #prepared: (total: number) => Uint8Array | null;
  /** The last Content-Length body's buffer. */
  allocated: _Allocation = { bytes: 0, prefaulted: false };

  constructor(
    conn: Deno.TcpConn,
    pooled?: _Idle,
    prepared: (total: number) => Uint8Array | null = () => null,
  ) {
    this.#prepared = prepared;
    this.#conn = conn;
    this.#buffer = pooled?.buffer ?? new Uint8Array(_FIRST_READ);
    this.#first = pooled?.read ?? null;
  }

  /** Whether no bytes beyond the response were received (else the connection is not reused). */
  get drained(): boolean {
    return this.#start === this.#end;
  }

  async #fill(): Promise<boolean> {
    if (this.#start > 0) {
      this.#buffer.copyWithin(0, this.#start, this.#end);
      this.#end -= this.#start;
      this.#start = 0;
    }
    if (this.#end === this.#buffer.length) {
      const grown = new Uint8Array(this.#buffer.length * 2);
      grown.set(this.#buffer);
      this.#buffer = grown;
    }
    let n: number | null;
    try {
      if (this.#first) {
        const first = await this.#first;
        this.#first = null;
        if (first instanceof Error) throw first;
        n = first;
      } else {
        n = await this.#conn.read(this.#buffer.subarray(this.#end));
      }
    } catch (error) {
      if (!this.#received) throw new _NothingReceived("connection reset", { cause: error });
      throw error;
    }
    if (n === null) {
      if (!this.#received) throw new _NothingReceived("connection closed");
      return false;
    }
    this.#received = true;
    this.#end += n;
    return true;
  }

  async readHead(): Promise<Uint8Array> {
    const head = await this.#until(_CRLFCRLF, "HTTP response head too large", "the response head");
    return head.slice();
  }

  async readLine(): Promise<string> {
    return _decoder.decode(await this.#until(_CRLF, "HTTP chunk line too long", "a chunked body"));
  }

  /** The bytes before the next `delimiter` (valid until the next read), consumed with it. */
  async #until(delimiter: DelimiterFinder, tooLong: string, inside: string): Promise<Uint8Array> {
    let from = this.#start;
    for (;;) {
      const back = delimiter.pattern.length - 1;
      const at = delimiter.find(
        this.#buffer.subarray(0, this.#end),
        Math.max(this.#start, from - back),
      );
      if (at >= 0) {
        const bytes = this.#buffer.subarray(this.#start, at);
        this.#start = at + delimiter.pattern.length;
        return bytes;
      }
      if (this.#end - this.#start > _HEAD_LIMIT) throw new Error(tooLong);
      from = this.#end;
      const shift = this.#start;
      if (!(await this.#fill())) throw new Error(`connection closed inside ${inside}`);
      from -= shift;
    }
  }

  /** Copies exactly `target.length` bytes into `target`. */
  async readInto(target: Uint8Array): Promise<void> {
    const buffered = Math.min(this.#end - this.#start, target.length);
    target.set(this.#buffer.subarray(this.#start, this.#start + buffered));
    this.#start += buffered;
    let offset = buffered;
    while (offset < target.length) {
      const n = await this.#conn.read(target.subarray(offset));
      if (n === null) throw new Error("connection closed before the end of the response body");
      offset += n;
    }
  }

  async readExact(length: number, observer?: BodyObserver): Promise<Uint8Array> {
    if (!observer) {
      const body = this.#allocate(length);
      await this.readInto(body);
      return body;
    }
    const want = Math.min(length, _PREFIX_BYTES);
    while (this.#end - this.#start < want) {
      if (!(await this.#fill())) break;
    }
    const prefix = this.#buffer.subarray(this.#start, Math.min(this.#end, this.#start + length));
    const pad = observer.pad(prefix);
    const body = this.#allocate(pad + length).subarray(pad, pad + length);
    body.set(prefix);
    this.#start += prefix.length;
    let offset = prefix.length;
    await observer.update(body, offset);
    while (offset < length) {
      const n = await this.#conn.read(body.subarray(offset, Math.min(length, offset + _STEP)));
      if (n === null) throw new Error("connection closed before the end of the response body");
      offset += n;
      await observer.update(body, offset);
    }
    return body;
  }

  #allocate(total: number): Uint8Array {
    const prepared = this.#prepared(total);
    this.allocated = { bytes: total, prefaulted: prepared !== null };
    return prepared ? prepared.subarray(0, total) : new Uint8Array(total);
  }

  async readChunked(): Promise<Uint8Array> {
    let body = new Uint8Array(64 * 1024);
    let length = 0;
    for (;;) {
      const line = await this.readLine();
      const sizeText = line.split(";")[0].trim();
      if (!/^[0-9a-fA-F]{1,15}$/.test(sizeText)) {
        throw new Error(`malformed chunk size: ${JSON.stringify(line)}`);
      }
      const size = parseInt(sizeText, 16);
      if (size === 0) break;
      if (length + size > body.length) {
        const grown = new Uint8Array(Math.max(body.length * 2, length + size));
        grown.set(body.subarray(0, length));
        body = grown;
      }
      await this.readInto(body.subarray(length, length + size));
      length += size;
      if ((await this.readLine()) !== "") throw new Error("malformed chunked body");
    }
    while ((await this.readLine()) !== "") { /* trailer fields are ignored */ }
    return body.subarray(0, length);
  }

  async readToEnd(): Promise<Uint8Array> {
    while (await this.#fill()) { /* until the server closes */ }
    const body = this.#buffer.slice(this.#start, this.#end);
    this.#start = this.#end;
    return body;
  }
}

const _CRLF = new DelimiterFinder(new Uint8Array([13, 10]));
const _CRLFCRLF = new DelimiterFinder(new Uint8Array([13, 10, 13, 10]));

function _closeQuietly(conn: Deno.TcpConn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}
