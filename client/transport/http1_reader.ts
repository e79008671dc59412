/**
 * Reading one HTTP/1.1 response from a connection: the status line and headers, then a
 * Content-Length body straight into one buffer (watched by a {@linkcode BodyObserver} as it
 * arrives), a chunked body, or a body read to the end of the connection. 1xx interim responses
 * are skipped.
 *
 * @module
 */

import { DelimiterFinder } from "../../protocol/bytes_search.ts";
import type { BodyObserver, TransportResponse } from "./transport.ts";

/** Size of the first read of a response (and of an idle connection's pending read). */
export const FIRST_READ_BYTES = 16 * 1024;
const _HEAD_LIMIT = 64 * 1024;
const _PREFIX_BYTES = 16 * 1024;
const _STEP = 2 * 1024 * 1024;
const _decoder = new TextDecoder("latin1");

/**
 * Nothing of a response arrived. On a reused idle connection the request is retried once if it
 * cannot have run: it is idempotent (GET, HEAD), or it was not all sent (`sent` false).
 */
export class NothingReceived extends Error {
  /** The whole request had been written when the connection ended. */
  sent = false;
}

/** A read begun on an idle connection: its result is the first read of the next response. */
export interface PendingRead {
  /** The buffer being read into. */
  buffer: Uint8Array;
  /** The bytes read, `null` at the end of the stream, or the read's error. */
  read: Promise<number | null | Error>;
}

/**
 * The buffer a body was read into: its size (padding included; for a chunked body, the bytes it
 * filled), and whether it was prepared in advance.
 */
export interface Allocation {
  /** Bytes allocated (0: no body read into a buffer of its own). */
  bytes: number;
  /** The buffer was prepared in advance. */
  prefaulted: boolean;
}

/**
 * Reads one response (after any 1xx interim ones) and says whether the connection may be
 * reused for another request.
 */
export async function readResponse(
  reader: ResponseReader,
  method: string,
  observe?: (headers: Headers) => BodyObserver | undefined,
  watch?: (headers: Headers) => ((piece: Uint8Array) => void) | undefined,
): Promise<{ response: TransportResponse; keepAlive: boolean }> {
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
    const sink = watch?.(headers);
    const encoding = (headers.get("transfer-encoding") ?? "").toLowerCase().trim();
    const lengthHeader = headers.get("content-length");
    if (method === "HEAD" || status === 101 || status === 204 || status === 304) {
      body = new Uint8Array(0);
    } else if (encoding !== "") {
      // Only chunked, alone: a coding under it (gzip, chunked) is not decoded here.
      if (encoding !== "chunked") {
        throw new Error(`unsupported transfer-encoding: ${encoding}`);
      }
      body = await reader.readChunked(sink, observe?.(headers));
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
    // Chunked bodies were shown piece by piece; others arrive whole.
    if (sink && encoding === "" && body.length > 0) sink(body);
    return { response: { status, headers, body }, keepAlive };
  }
}

/** Buffered reads from a connection; large bodies are read straight into their buffer. */
export class ResponseReader {
  readonly #conn: Deno.TcpConn;
  #buffer: Uint8Array;
  /** A read begun while the connection was idle (into `#buffer`): the first one to use. */
  #first: Promise<number | null | Error> | null;
  #start = 0;
  #end = 0;
  #received = false;

  readonly #prepared: (total?: number) => Uint8Array | null;
  /** The last Content-Length body's buffer. */
  allocated: Allocation = { bytes: 0, prefaulted: false };

  /**
   * A reader of `conn`; `pooled` is the read begun while it was idle, `prepared` may supply a
   * buffer (prepared in advance) for a Content-Length body of `total` bytes, or for a chunked
   * body (`total` undefined: its length is not known).
   */
  constructor(
    conn: Deno.TcpConn,
    pooled?: PendingRead,
    prepared: (total?: number) => Uint8Array | null = () => null,
  ) {
    this.#prepared = prepared;
    this.#conn = conn;
    this.#buffer = pooled?.buffer ?? new Uint8Array(FIRST_READ_BYTES);
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
      if (!this.#received) throw new NothingReceived("connection reset", { cause: error });
      throw error;
    }
    if (n === null) {
      if (!this.#received) throw new NothingReceived("connection closed");
      return false;
    }
    this.#received = true;
    this.#end += n;
    return true;
  }

  /** The response head up to (without) its blank line. */
  async readHead(): Promise<Uint8Array> {
    const head = await this.#until(_CRLFCRLF, "HTTP response head too large", "the response head");
    return head.slice();
  }

  /** One CRLF-terminated line of a chunked body (latin1). */
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

  /** A Content-Length body of `length` bytes, watched by `observer` as it arrives. */
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

  /**
   * A chunked body (trailer fields are read and ignored); `sink` sees each chunk, `observer`
   * the body so far after each chunk (as a Content-Length body's, with the padding it asks for
   * from the first chunk): a routed answer is hashed while it arrives, not after.
   */
  async readChunked(
    sink?: (piece: Uint8Array) => void,
    observer?: BodyObserver,
  ): Promise<Uint8Array> {
    // A buffer prepared for an answer as large as the last one (a routed answer has no
    // Content-Length), else one that grows with the body (growBodyBuffer).
    const prepared = this.#prepared();
    let buffer = prepared ?? new Uint8Array(64 * 1024);
    let pad = 0;
    let length = 0;
    /** What the observer has seen. */
    let observed = 0;
    // As a Content-Length body's: every _STEP bytes, not every chunk (each update hands the new
    // bytes to the hash thread in one message), and the rest at the end.
    const observe = async (step: number) => {
      if (!observer || length - observed < step) return;
      observed = length;
      await observer.update(buffer.subarray(pad, pad + length), length);
    };
    for (;;) {
      const line = await this.readLine();
      const sizeText = line.split(";")[0].trim();
      if (!/^[0-9a-fA-F]{1,15}$/.test(sizeText)) {
        throw new Error(`malformed chunk size: ${JSON.stringify(line)}`);
      }
      const size = parseInt(sizeText, 16);
      if (size === 0) break;
      if (observer && length === 0) {
        // The first chunk decides the padding: read it aside, then place it.
        const first = new Uint8Array(size);
        await this.readInto(first);
        pad = observer.pad(first);
        if (pad + size > buffer.length) buffer = new Uint8Array(pad + size);
        buffer.set(first, pad);
      } else {
        if (pad + length + size > buffer.length) {
          buffer = growBodyBuffer(buffer, pad + length, pad + length + size);
        }
        await this.readInto(buffer.subarray(pad + length, pad + length + size));
      }
      sink?.(buffer.slice(pad + length, pad + length + size));
      length += size;
      await observe(_STEP);
      if ((await this.readLine()) !== "") throw new Error("malformed chunked body");
    }
    await observe(1);
    while ((await this.readLine()) !== "") { /* trailer fields are ignored */ }
    if (buffer === prepared && 2 * (pad + length) < buffer.length) {
      // Much smaller than the answer prepared for: a buffer of its own (with its padding), so
      // that holding the body does not hold the whole prepared buffer.
      const own = new Uint8Array(pad + length);
      own.set(buffer.subarray(pad, pad + length), pad);
      buffer = own;
    }
    this.allocated = { bytes: pad + length, prefaulted: prepared !== null && buffer === prepared };
    return buffer.subarray(pad, pad + length);
  }

  /** Everything until the server closes the connection. */
  async readToEnd(): Promise<Uint8Array> {
    while (await this.#fill()) { /* until the server closes */ }
    const body = this.#buffer.slice(this.#start, this.#end);
    this.#start = this.#end;
    return body;
  }
}

/** From this size on, a body buffer grows in place instead of by copying. */
const _IN_PLACE_FROM = 1 << 20;
/** The least address space an in-place body buffer reserves (virtual: nothing is touched). */
const _RESERVE_MIN = 256 * 1024 * 1024;
/** An in-place body buffer reserves this many times what it must hold when it is made. */
const _RESERVE_FACTOR = 64;

/**
 * A body buffer of at least `needed` bytes holding the first `used` bytes of `buffer`. A body of
 * unknown length (chunked) would otherwise grow by doubling: a 64 MiB body then faults in 128 MiB
 * of fresh memory and copies 64 MiB on the way, about as much as receiving it. From 1 MiB on the
 * buffer is a resizable `ArrayBuffer` that grows in place: it reserves address space (at least
 * 256 MiB, or 64 × its size) and pages are mapped as the body fills them; past its reservation
 * it moves once into a larger one. What the caller gets is a fixed-length view, which every
 * platform API takes (digests, sockets, files, `postMessage`). Measured in
 * docs/decisions/router-large-bodies.md.
 *
 * @example
 * ```ts
 * import { growBodyBuffer } from "./http1_reader.ts";
 *
 * let body: Uint8Array = new Uint8Array(64 * 1024);
 * body[7] = 1;
 * for (const size of [2 << 20, 8 << 20]) body = growBodyBuffer(body, 8, size);
 * if (body.length < 8 << 20 || body[7] !== 1) throw new Error("not grown");
 * if (!(body.buffer as ArrayBuffer).resizable) throw new Error("copied, not grown in place");
 * ```
 */
export function growBodyBuffer(
  buffer: Uint8Array,
  used: number,
  needed: number,
): Uint8Array<ArrayBuffer> {
  const size = Math.max(buffer.length * 2, needed);
  const backing = buffer.buffer as ArrayBuffer;
  if (backing.resizable && buffer.byteOffset === 0 && needed <= backing.maxByteLength) {
    backing.resize(Math.min(size, backing.maxByteLength));
    return new Uint8Array(backing, 0, backing.byteLength);
  }
  let grown: Uint8Array<ArrayBuffer>;
  if (size < _IN_PLACE_FROM) grown = new Uint8Array(size);
  else {
    const reserve = Math.max(_RESERVE_MIN, _RESERVE_FACTOR * size);
    try {
      grown = new Uint8Array(new ArrayBuffer(size, { maxByteLength: reserve }), 0, size);
    } catch {
      grown = new Uint8Array(size); // no room to reserve: a plain buffer, doubling as before
    }
  }
  grown.set(buffer.subarray(0, used));
  return grown;
}

const _CRLF = new DelimiterFinder(new Uint8Array([13, 10]));
const _CRLFCRLF = new DelimiterFinder(new Uint8Array([13, 10, 13, 10]));
