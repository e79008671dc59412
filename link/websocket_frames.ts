/**
 * The WebSocket frame (RFC 6455 §5) as both ends of a node link read and write it: a frame's
 * header read and judged, its payload read (a large one straight into its own buffer) and
 * unmasked, frames queued and written in order (masked by the client, §5.3) into reused buffers
 * of their size, a close frame's payload, and a whole message's data as the `WebSocket`
 * interface gives it. The ends: websocket_client.ts (the node's), websocket_server.ts (the
 * Router's).
 *
 * @module
 */
import { releaseBuffer } from "../protocol/bytes.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import { maskInto } from "./websocket_mask.ts";

/** The close event's fields, as the platform's `CloseEvent` has them. */
export interface WebSocketCloseInfo {
  /** The close code (1006 when the connection ended without a closing handshake). */
  code: number;
  /** The close reason. */
  reason: string;
  /** Whether the closing handshake completed. */
  wasClean: boolean;
}

/** A frame's header as read. */
export interface FrameHeader {
  /** The message's last frame. */
  fin: boolean;
  /** The RSV1–3 bits (0 without an extension, and none is negotiated). */
  rsv: number;
  /** The opcode (0 continuation, 1 text, 2 binary, 8 close, 9 ping, 10 pong). */
  opcode: number;
  /** Whether the payload is masked. */
  masked: boolean;
  /** The payload's length (`Infinity` for a 64-bit length past 2^53). */
  length: number;
  /** The masking key (4 bytes; empty when unmasked). */
  key: Uint8Array;
}

/**
 * The read buffer's first size: enough for a frame header and the small messages (hello,
 * credit, status); grown while reads fill it, up to {@linkcode _READ_BUFFER_MAX}. A payload
 * larger than what is buffered gets its own buffer. A Router holds one per node connection
 * (hundreds): their memory counts against the collector's budget.
 */
const _READ_BUFFER = 4 * 1024;
const _READ_BUFFER_MAX = 64 * 1024;
/** Frames of at least this many bytes reuse the buffers of written ones. */
const _REUSE_BYTES = 64 * 1024;
/** Written frames' buffers kept per connection for reuse (4 × 256 KiB data frames). */
const _SPARES = 4;

/**
 * What is wrong with a frame, by its header alone, after data frames of `partsOpcode` (0: no
 * message begun); `fromClient`: frames must be masked (else: must not be).
 */
export function frameProblem(
  header: FrameHeader,
  partsOpcode: number,
  fromClient: boolean,
): string | null {
  const { fin, rsv, opcode, masked, length } = header;
  if (rsv !== 0) return "reserved bits set without an extension";
  if (fromClient && !masked) return "an unmasked frame from a client";
  if (!fromClient && masked) return "a masked frame from a server";
  if ((opcode > 2 && opcode < 8) || opcode > 10) return `unknown opcode ${opcode}`;
  if (opcode >= 8) {
    if (!fin) return "a fragmented control frame";
    if (length > 125) return "a control frame over 125 bytes";
    return null;
  }
  if (opcode === 0 && partsOpcode === 0) return "a continuation frame without a message";
  if (opcode !== 0 && partsOpcode !== 0) return "a new message inside a fragmented one";
  return null;
}

/**
 * A whole message as the `WebSocket` interface gives it: text (opcode 1) as a `string` (throws
 * when it is not UTF-8), binary as an `ArrayBuffer` (the bytes' own when they fill it).
 */
export function messageData(whole: Uint8Array, opcode: number): string | ArrayBuffer {
  if (opcode === 1) return decodeUtf8(whole);
  return whole.byteOffset === 0 && whole.byteLength === whole.buffer.byteLength
    ? whole.buffer as ArrayBuffer
    : whole.slice().buffer;
}

/** A close frame's payload: `code`, then `reason` in UTF-8 cut to the 123 bytes that fit. */
export function closePayload(code: number, reason: string): Uint8Array {
  const reasonBytes = _encoder.encode(reason).subarray(0, 123);
  const payload = new Uint8Array(2 + reasonBytes.length);
  payload[0] = code >> 8;
  payload[1] = code & 0xff;
  payload.set(reasonBytes, 2);
  return payload;
}

const _encoder = new TextEncoder();

/**
 * Reads frame headers and payloads from a connection; a payload larger than what is buffered
 * gets its own buffer, read into straight from the connection.
 */
export class FrameReader {
  /** Why the connection's last read failed (reset, or closed under the read), once one did. */
  readError: unknown = null;
  readonly #conn: Deno.Conn;
  readonly #received: () => void;
  #buffer: Uint8Array = new Uint8Array(_READ_BUFFER);
  #start = 0;
  #end = 0;

  /** Frames from `conn`, after the bytes `initial` already read; `received` after each read. */
  constructor(conn: Deno.Conn, initial: Uint8Array, received: () => void = () => {}) {
    this.#conn = conn;
    this.#received = received;
    if (initial.length > this.#buffer.length) this.#buffer = new Uint8Array(initial.length);
    this.#buffer.set(initial);
    this.#end = initial.length;
  }

  /** The next frame's header; `null` at the end of the connection. */
  async header(): Promise<FrameHeader | null> {
    if (!(await this.#fill(2))) return null;
    const b0 = this.#buffer[this.#start];
    const b1 = this.#buffer[this.#start + 1];
    const masked = (b1 & 0x80) !== 0;
    let length = b1 & 0x7f;
    let size = 2;
    if (length === 126) size = 4;
    else if (length === 127) size = 10;
    if (masked) size += 4;
    if (!(await this.#fill(size))) return null;
    const at = this.#start;
    if (length === 126) length = (this.#buffer[at + 2] << 8) | this.#buffer[at + 3];
    else if (length === 127) {
      const view = new DataView(this.#buffer.buffer, this.#buffer.byteOffset + at + 2, 8);
      const big = view.getBigUint64(0);
      length = big > BigInt(Number.MAX_SAFE_INTEGER) ? Infinity : Number(big);
    }
    const key = masked ? this.#buffer.slice(at + size - 4, at + size) : new Uint8Array(0);
    this.#start += size;
    return {
      fin: (b0 & 0x80) !== 0,
      rsv: (b0 >> 4) & 0x07,
      opcode: b0 & 0x0f,
      masked,
      length,
      key,
    };
  }

  /**
   * `length` payload bytes, unmasked with `key` (none when empty), in a buffer of their own;
   * `null` at the end.
   */
  async payload(length: number, key: Uint8Array): Promise<Uint8Array | null> {
    const have = this.#end - this.#start;
    const out = new Uint8Array(length);
    if (have >= length) {
      const bytes = this.#buffer.subarray(this.#start, this.#start + length);
      if (key.length === 0) out.set(bytes);
      else maskInto(bytes, key, out);
      this.#start += length;
      return out;
    }
    // Straight from the connection into the message's own buffer, then unmasked in place.
    out.set(this.#buffer.subarray(this.#start, this.#end));
    this.#start = this.#end = 0;
    for (let filled = have; filled < length;) {
      const read = await this.#read(out.subarray(filled));
      if (read === null) return null;
      this.#received();
      filled += read;
    }
    if (key.length !== 0) maskInto(out, key, out);
    return out;
  }

  /** Ensures `n` bytes are buffered from `#start`; false at the end of the connection. */
  async #fill(n: number): Promise<boolean> {
    while (this.#end - this.#start < n) {
      if (this.#start > 0) {
        this.#buffer.copyWithin(0, this.#start, this.#end);
        this.#end -= this.#start;
        this.#start = 0;
      }
      const read = await this.#read(this.#buffer.subarray(this.#end));
      if (read === null) return false;
      this.#received();
      this.#end += read;
      // A read that filled the buffer: messages come faster than one read a buffer.
      if (this.#end === this.#buffer.length && this.#buffer.length < _READ_BUFFER_MAX) {
        const grown = new Uint8Array(this.#buffer.length * 4);
        grown.set(this.#buffer.subarray(0, this.#end));
        this.#buffer = grown;
      }
    }
    return true;
  }

  /** A read of the connection; `null` at its end, and when it failed ({@linkcode FrameReader.readError}). */
  #read(into: Uint8Array): Promise<number | null> {
    return this.#conn.read(into).catch((error) => {
      this.readError = error;
      return null;
    });
  }
}

/**
 * Frames queued onto one connection and written in order, each a copy of its payload after its
 * header (masked with a fresh key when `masked`: a client's, RFC 6455 §5.3). A written frame's
 * buffer of at least 64 KiB is kept for the next frame of its size (a body goes as many frames
 * of one size; a new buffer lands on fresh pages, and page faults on every byte the mask writes,
 * docs/decisions/router-large-bodies.md); beyond four, the oldest is given back at once
 * (protocol/bytes.ts).
 */
export class FrameWriter {
  /** Bytes queued and not yet written. */
  buffered = 0;
  /** When a frame was last queued (`performance.now()`). */
  lastQueued = 0;
  /** Settles once every frame queued so far has been written (or its write failed). */
  written: Promise<void> = Promise.resolve();
  readonly #conn: Deno.Conn;
  readonly #masked: boolean;
  readonly #spares: ArrayBuffer[] = [];
  #closed = false;

  /** Frames onto `conn`, masked when `masked` (a client's). */
  constructor(conn: Deno.Conn, masked: boolean) {
    this.#conn = conn;
    this.#masked = masked;
  }

  /** Buffers of written frames kept for reuse. */
  get spares(): number {
    return this.#spares.length;
  }

  /**
   * Queues one frame of `opcode` with `payload` (one array, or parts in order; copied before
   * this returns).
   */
  write(opcode: number, payload: Uint8Array | readonly Uint8Array[]): void {
    const frame = this.#frame(opcode, payload instanceof Uint8Array ? [payload] : payload);
    const conn = this.#conn;
    this.buffered += frame.length;
    this.lastQueued = performance.now();
    this.written = this.written.then(async () => {
      try {
        for (let at = 0; at < frame.length;) at += await conn.write(frame.subarray(at));
      } catch {
        // The connection failed: the read loop sees it end.
      } finally {
        this.buffered -= frame.length;
        this.#recycle(frame);
      }
    });
  }

  /** Gives back the spare buffers (once the socket has been quiet a while). */
  releaseSpares(): void {
    for (const spare of this.#spares.splice(0)) releaseBuffer(new Uint8Array(spare));
  }

  /** The connection ended: the spares given back, and buffers of frames written after too. */
  close(): void {
    this.#closed = true;
    this.releaseSpares();
  }

  /** A frame's bytes, in a spare buffer of its size when there is one. */
  #frame(opcode: number, parts: readonly Uint8Array[]): Uint8Array {
    let length = 0;
    for (const part of parts) length += part.length;
    const header = length < 126 ? 2 : length < 65536 ? 4 : 10;
    const keyBytes = this.#masked ? 4 : 0;
    const size = header + keyBytes + length;
    const spare = this.#spares.findLastIndex((b) => b.byteLength === size);
    const frame = spare >= 0
      ? new Uint8Array(this.#spares.splice(spare, 1)[0])
      : new Uint8Array(size);
    const maskBit = this.#masked ? 0x80 : 0;
    frame[0] = 0x80 | opcode;
    if (header === 2) frame[1] = maskBit | length;
    else if (header === 4) {
      frame[1] = maskBit | 126;
      frame[2] = length >> 8;
      frame[3] = length & 0xff;
    } else {
      frame[1] = maskBit | 127;
      new DataView(frame.buffer, 2, 8).setBigUint64(0, BigInt(length));
    }
    let at = header + keyBytes;
    if (!this.#masked) {
      for (const part of parts) (frame.set(part, at), at += part.length);
      return frame;
    }
    const key = frame.subarray(header, header + 4);
    crypto.getRandomValues(key);
    for (const part of parts) {
      maskInto(part, key, frame.subarray(at), at - header - 4);
      at += part.length;
    }
    return frame;
  }

  /** A written frame's buffer: kept for the next frame of its size, a few at most. */
  #recycle(frame: Uint8Array): void {
    if (frame.buffer.byteLength < _REUSE_BYTES) return;
    if (this.#closed) return releaseBuffer(frame);
    this.#spares.push(frame.buffer as ArrayBuffer);
    // The oldest goes first: the spares follow the size of the frames sent lately.
    if (this.#spares.length > _SPARES) releaseBuffer(new Uint8Array(this.#spares.shift()!));
  }
}

/** Closes `conn` (if any), already closed or not. */
export function closeQuietly(conn: Deno.Conn | null): void {
  try {
    conn?.close();
  } catch {
    // already closed
  }
}
