/**
 * What an HTTP/1.1 connection of http/http1_server.ts reads: the bytes received and not yet
 * consumed (at most one read pending, so a read left waiting for the client's end can become the
 * next head's), and a request body as a byte stream read straight into its reader's buffers
 * (`Content-Length` or chunked), under a progress watchdog (one timer per body).
 *
 * @module
 */
import { BodyReadError, BodyTimeoutError } from "./request_body.ts";
import type { BodyFraming } from "./http1_head.ts";

const _FIRST_BUFFER = 4 * 1024;
const _BODY_CHUNK = 64 * 1024;
/** A default reader's first read buffer (it doubles while reads fill it, up to _BODY_CHUNK). */
const _FIRST_CHUNK = 4 * 1024;

/** The client's connection ended while its request was in progress. */
export class ClientGoneError extends Error {
  /** `"ClientGoneError"`. */
  override name = "ClientGoneError";
}

/** Bytes received on a connection and not yet consumed; at most one read pending. */
export class ConnectionInput {
  buffer: Uint8Array = new Uint8Array(_FIRST_BUFFER);
  start = 0;
  end = 0;
  /** The connection ended (or failed) on the read side. */
  ended = false;
  #pending: Promise<boolean> | null = null;

  constructor(readonly conn: Deno.Conn) {}

  get buffered(): number {
    return this.end - this.start;
  }

  get reading(): boolean {
    return this.#pending !== null;
  }

  /** Reads more into the buffer: `true`, or `false` once the connection's input has ended. */
  more(): Promise<boolean> {
    if (this.#pending) return this.#pending;
    if (this.ended) return Promise.resolve(false);
    // A read into a short tail would split the next request's head over two reads.
    if (this.start === this.end) this.start = this.end = 0;
    const tail = this.buffer.length - this.end;
    if (tail === 0 || (this.start > 0 && tail < this.buffer.length / 4)) this.#makeRoom();
    this.#pending = this.conn.read(this.buffer.subarray(this.end)).then((n) => {
      this.#pending = null;
      if (n === null) this.ended = true;
      else this.end += n;
      return n !== null;
    }, () => {
      this.#pending = null;
      this.ended = true;
      return false;
    });
    return this.#pending;
  }

  /** Moves unread bytes to the front, or grows the buffer (only while no read is pending). */
  #makeRoom(): void {
    if (this.start > 0) {
      this.buffer.copyWithin(0, this.start, this.end);
      this.end -= this.start;
      this.start = 0;
    } else {
      const grown = new Uint8Array(this.buffer.length * 2);
      grown.set(this.buffer.subarray(0, this.end));
      this.buffer = grown;
    }
  }

  /** Takes up to `n` buffered bytes into `target`; how many. */
  take(target: Uint8Array, n: number): number {
    const k = Math.min(n, this.buffered);
    target.set(this.buffer.subarray(this.start, this.start + k));
    this.start += k;
    return k;
  }

  /** The buffered bytes up to `length` bytes, consumed. */
  takeBytes(length: number): Uint8Array {
    const bytes = this.buffer.slice(this.start, this.start + length);
    this.start += length;
    return bytes;
  }
}

/** What a {@linkcode RequestBody} tells its connection. */
export interface RequestBodyEvents {
  /** The first read was asked for (an `Expect: 100-continue` is answered then). */
  started(): Promise<void> | void;
  /** The body was read to its end. */
  ended(): void;
  /** The body failed (cut short, framed wrongly, the client gone). */
  failed(error: Error): void;
  /** No byte came for the body timeout while a read waited. */
  stalled(): void;
}

/**
 * A request body as a byte stream: a BYOB reader's reads go straight into its buffers; a default
 * reader's into a buffer of the body's own, given out whole when a read half-fills it (it doubles,
 * up to 64 KiB, while reads fill it) and else kept for the next read, the bytes given as a copy: a
 * body that trickles costs no fresh buffer per read.
 */
export class RequestBody {
  readonly stream: ReadableStream<Uint8Array>;
  /** Read to its end. */
  ended = false;
  /** Cut for making no progress (answered 408 by the connection). */
  cut = false;
  readonly #input: ConnectionInput;
  readonly #framing: BodyFraming;
  readonly #timeoutMs: number;
  readonly #events: RequestBodyEvents;
  #remaining: number;
  /** Chunked: bytes left of the current chunk (0: a size line comes next). */
  #chunkLeft = 0;
  #started = false;
  /** When a read began waiting on the connection (0: none waits). */
  #waitingSince = 0;
  #lastProgress = 0;
  #watchdog: ReturnType<typeof setTimeout> | undefined;
  /** A default reader's read buffer, kept from a read that returned little. */
  #spare: Uint8Array | null = null;
  /** The size of a default reader's next fresh read buffer. */
  #chunkSize = _FIRST_CHUNK;

  constructor(
    input: ConnectionInput,
    framing: BodyFraming,
    timeoutMs: number,
    events: RequestBodyEvents,
  ) {
    this.#input = input;
    this.#framing = framing;
    this.#timeoutMs = timeoutMs;
    this.#events = events;
    this.#remaining = framing.kind === "length" ? framing.length : 0;
    this.stream = new ReadableStream({
      type: "bytes",
      pull: (controller) => this.#pull(controller),
      cancel: () => {
        this.#spare = null;
        clearTimeout(this.#watchdog);
      },
    });
  }

  /** A Content-Length body whose rest is already buffered is dropped: whether it was. */
  dropBuffered(): boolean {
    if (this.ended || this.#framing.kind !== "length") return this.ended;
    if (this.#input.buffered < this.#remaining) return false;
    this.#input.start += this.#remaining;
    this.#remaining = 0;
    this.ended = true;
    return true;
  }

  async #pull(controller: ReadableByteStreamController): Promise<void> {
    const request = controller.byobRequest;
    const view = request?.view;
    const target = view
      ? new Uint8Array(view.buffer, view.byteOffset, view.byteLength)
      : this.#spare ?? new Uint8Array(
        this.#framing.kind === "length"
          ? Math.max(1, Math.min(this.#chunkSize, this.#remaining))
          : this.#chunkSize,
      );
    if (!this.#started) {
      this.#started = true;
      await this.#events.started();
    }
    let n: number;
    try {
      n = this.#framing.kind === "chunked"
        ? await this.#readChunked(target)
        : await this.#readLength(target);
    } catch (error) {
      clearTimeout(this.#watchdog);
      const failure = this.cut ? new BodyTimeoutError(this.#timeoutMs) : error as Error;
      this.#events.failed(failure);
      controller.error(failure);
      return;
    }
    if (this.cut) {
      // A read that completed as the body was cut: its bytes are not given out.
      controller.error(new BodyTimeoutError(this.#timeoutMs));
      return;
    }
    if (n === 0) {
      this.#end();
      controller.close();
      request?.respond(0);
      return;
    }
    if (request) request.respond(n);
    else controller.enqueue(this.#chunk(target, n));
    if (this.#framing.kind === "length" && this.#remaining === 0) {
      this.#end();
      controller.close();
    }
  }

  /** The `n` bytes a default reader's read put into `target`, as the chunk to give out. */
  #chunk(target: Uint8Array, n: number): Uint8Array {
    if (n === target.length) this.#chunkSize = Math.min(2 * this.#chunkSize, _BODY_CHUNK);
    if (2 * n >= target.length) {
      this.#spare = null;
      return target.subarray(0, n);
    }
    this.#spare = target;
    return target.slice(0, n);
  }

  #end(): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.#watchdog);
    this.#events.ended();
  }

  async #readLength(target: Uint8Array): Promise<number> {
    if (this.#remaining === 0) return 0;
    const want = Math.min(target.length, this.#remaining);
    const input = this.#input;
    let n = input.take(target, want);
    if (n === 0) {
      // Straight into the reader's buffer: nothing else reads this connection now.
      const got = await this.#wait(input.conn.read(target.subarray(0, want)));
      if (got === null) {
        input.ended = true;
        throw new ClientGoneError(
          "the request body ended before its Content-Length (the client closed the connection)",
        );
      }
      n = got;
    }
    this.#remaining -= n;
    return n;
  }

  async #readChunked(target: Uint8Array): Promise<number> {
    const input = this.#input;
    for (;;) {
      if (this.#chunkLeft > 0) {
        if (input.buffered === 0) await this.#fill();
        const n = input.take(target, Math.min(target.length, this.#chunkLeft));
        this.#chunkLeft -= n;
        if (this.#chunkLeft === 0) this.#chunkLeft = -1; // its CRLF comes next
        return n;
      }
      if (this.#chunkLeft === -1) {
        const line = await this.#line();
        if (line !== "") throw new BodyReadError("invalid chunked encoding: no CRLF after a chunk");
        this.#chunkLeft = 0;
        continue;
      }
      const line = await this.#line();
      const size = line.split(";")[0].trim();
      if (!/^[0-9a-fA-F]{1,12}$/.test(size)) {
        throw new BodyReadError(
          `invalid chunked encoding: chunk size ${JSON.stringify(size.slice(0, 20))}`,
        );
      }
      const length = parseInt(size, 16);
      if (length > 0) {
        this.#chunkLeft = length;
        continue;
      }
      // The last chunk: trailer fields (ignored) up to an empty line.
      for (let fields = 0; (await this.#line()) !== ""; fields++) {
        if (fields > 100) throw new BodyReadError("invalid chunked encoding: too many trailers");
      }
      return 0;
    }
  }

  /** One CRLF-terminated line of a chunked body (at most 4 KiB). */
  async #line(): Promise<string> {
    const input = this.#input;
    for (;;) {
      const at = input.buffer.subarray(input.start, input.end).indexOf(10);
      if (at !== -1) {
        const bytes = input.takeBytes(at + 1);
        const line = String.fromCharCode(...bytes.subarray(0, at));
        return line.endsWith("\r") ? line.slice(0, -1) : line;
      }
      if (input.buffered > 4096) throw new BodyReadError("invalid chunked encoding: line too long");
      await this.#fill();
    }
  }

  async #fill(): Promise<void> {
    if (!await this.#wait(this.#input.more())) {
      throw new ClientGoneError("the request body ended early (the client closed the connection)");
    }
  }

  /** A read of the connection under the progress watchdog. */
  async #wait<T>(read: Promise<T>): Promise<T> {
    const now = performance.now();
    this.#waitingSince = now;
    if (this.#lastProgress === 0) this.#lastProgress = now;
    if (this.#watchdog === undefined) this.#arm(this.#timeoutMs);
    try {
      return await read;
    } finally {
      this.#waitingSince = 0;
      this.#lastProgress = performance.now();
    }
  }

  /** One timer per body: it looks at the last progress when it fires, and re-arms. */
  #arm(ms: number): void {
    this.#watchdog = setTimeout(() => {
      if (this.ended) return;
      const since = this.#waitingSince === 0 ? 0 : performance.now() - this.#lastProgress;
      if (this.#waitingSince !== 0 && since >= this.#timeoutMs) {
        this.cut = true;
        this.#events.stalled();
        return;
      }
      this.#arm(this.#waitingSince === 0 ? this.#timeoutMs : this.#timeoutMs - since);
    }, Math.max(1, ms));
  }
}
