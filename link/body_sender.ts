/**
 * The sending end of a body through a node-link slot (link/frames.ts): the head and the body cut
 * into frames of at most 256 KiB of bytes, the first carrying the head, the last the end (a small
 * body: one frame with all three), a frame of bytes sent only while the receiver's credit lasts
 * (link/body_receiver.ts returns it). Neither end holds more than {@linkcode CREDIT_WINDOW} frames
 * of one body, however slow the other side's reader: what bounds the Router's memory per request
 * (a WebSocket has no back-pressure of its own). The Router's slots and a node's slot links both
 * use it.
 *
 * ```
 *   sendComplete(body) ──head+bytes+end──────▶   a small body, one frame
 *   sendHead()         ──head─────────────────▶   a body that streams from elsewhere
 *   write(chunk)       ──[head+]bytes─────────▶   frames of 256 KiB (credit − 1 each)
 *                      ◀──credit n─────────────   as the receiver's reader reads
 *   end()              ──[head+][bytes+]end───▶
 * ```
 *
 * @module
 */
import { frameWithRoom, markEnd } from "./frames.ts";
import {
  CREDIT_WINDOW,
  encodeMessage,
  LinkMessageError,
  MAX_DATA_BYTES,
  type RequestHead,
  type ResponseHead,
} from "./messages.ts";

const _utf8 = new TextEncoder();

/**
 * Sends one head and its body as frames, never more frames of bytes than the credit the receiver
 * gave.
 */
export class BodySender {
  readonly #requestId: string;
  /** The head's JSON, until a frame takes it. */
  #head: Uint8Array | null;
  /** The header of a frame without a head, for full frames sent as parts. */
  #plainHeader: Uint8Array | null = null;
  readonly #sendFrame: (frame: Uint8Array) => void;
  readonly #sendParts: ((parts: readonly Uint8Array[]) => void) | null;
  #credit = CREDIT_WINDOW;
  #granted = 0;
  #sentFrames = 0;
  /** A frame being gathered: its header, then room for bytes from `#stageAt`. */
  #stage: Uint8Array | null = null;
  #stageAt = 0;
  #staged = 0;
  #sentFull = false;
  #waiter: (() => void) | null = null;
  #failure: Error | null = null;
  #ended = false;
  /** Body bytes sent so far. */
  sentBytes = 0;

  /**
   * A sender of `head` and the body of request `requestId`: `sendFrame` sends one frame (it may
   * keep the buffer: each frame is a new one). `sendParts`, if given, sends one frame given as
   * parts (its header, then a slice of a written chunk) and copies them before it returns: full
   * frames of a large chunk then go out without being copied into a frame of their own first.
   */
  constructor(
    requestId: string,
    head: RequestHead | ResponseHead,
    sendFrame: (frame: Uint8Array) => void,
    sendParts?: (parts: readonly Uint8Array[]) => void,
  ) {
    this.#requestId = requestId;
    this.#head = _utf8.encode(encodeMessage(head));
    this.#sendFrame = sendFrame;
    this.#sendParts = sendParts ?? null;
  }

  /** The head's JSON for the next frame, once. */
  #takeHead(): Uint8Array | null {
    const head = this.#head;
    this.#head = null;
    return head;
  }

  /**
   * Sends the head now, alone, unless a frame has taken it: for a body that streams from
   * elsewhere, or an answer whose pieces must not wait for a first frame of bytes. Throws the
   * slot's failure.
   */
  sendHead(): void {
    if (this.#failure) throw this.#failure;
    const head = this.#takeHead();
    if (head !== null) this.#sendFrame(frameWithRoom(this.#requestId, head, 0));
  }

  /**
   * The whole body, at most 256 KiB, with the head (unless it went already) and the end, as one
   * frame, sent before this returns: a small exchange is one frame each way. Only before any of
   * the body went. Throws the slot's failure, also one that the send itself met (nothing reached
   * the peer then).
   */
  sendComplete(body: Uint8Array): void {
    if (this.#failure) throw this.#failure;
    if (this.#ended || this.#sentFrames > 0 || this.#staged > 0) {
      throw new Error("the body is already being sent frame by frame");
    }
    if (body.length > MAX_DATA_BYTES) {
      throw new RangeError(`a frame carries at most ${MAX_DATA_BYTES} bytes of body`);
    }
    const frame = frameWithRoom(this.#requestId, this.#takeHead(), body.length);
    frame.set(body, frame.length - body.length);
    markEnd(frame);
    if (body.length > 0) (this.#credit--, this.#sentFrames++);
    this.sentBytes = body.length;
    this.#ended = true;
    this.#sendFrame(frame);
    if (this.#failure) throw this.#failure;
  }

  /**
   * Room for the body bytes of a new frame, `capacity` of them (at most 256 KiB, the default):
   * fill it in place (e.g. with a BYOB read, which moves the memory: keep the view over the same
   * range of the memory the read gave back) and pass what was filled to
   * {@linkcode BodySender.sendPayload}. Size it to the bytes expected: a new buffer is zeroed,
   * which costs more than the bytes it will carry. A head still pending goes out first, alone.
   */
  payloadBuffer(capacity: number = MAX_DATA_BYTES): Uint8Array<ArrayBuffer> {
    this.sendHead();
    const room = Math.min(capacity, MAX_DATA_BYTES);
    const frame = frameWithRoom(this.#requestId, null, room);
    return frame.subarray(frame.length - room);
  }

  /**
   * Sends bytes filled into a buffer from {@linkcode BodySender.payloadBuffer}: `payload` is a
   * view of it from its first byte (the frame's header lies before), once there is credit.
   */
  async sendPayload(payload: Uint8Array): Promise<void> {
    await this.#flush(false);
    const frame = new Uint8Array(payload.buffer, 0, payload.byteOffset + payload.length);
    await this.#frame(frame, payload.length, false);
  }

  /**
   * The receiver's `credit` message. More than it has been sent in all is a violation
   * ({@linkcode LinkMessageError}).
   */
  credit(frames: number): void {
    this.#granted += frames;
    if (this.#granted > this.#sentFrames) {
      throw new LinkMessageError("credit for frames that were never sent");
    }
    this.#credit += frames;
    this.#wake();
  }

  /**
   * Sends `chunk`, copied into frames of at most 256 KiB (small chunks are gathered into one;
   * the first frame carries the head). Resolves once it is handed to the connection; rejects
   * once the slot failed.
   */
  async write(chunk: Uint8Array): Promise<void> {
    let rest = chunk;
    while (rest.length > 0) {
      if (this.#failure) throw this.#failure;
      if (this.#sendParts && this.#staged === 0 && rest.length >= MAX_DATA_BYTES) {
        // A full frame straight from the chunk, as parts (no frame of its own to copy into).
        const head = this.#takeHead();
        const header = head !== null
          ? frameWithRoom(this.#requestId, head, 0)
          : (this.#plainHeader ??= frameWithRoom(this.#requestId, null, 0));
        await this.#frame([header, rest.subarray(0, MAX_DATA_BYTES)], MAX_DATA_BYTES, false);
        this.#sentFull = true;
        rest = rest.subarray(MAX_DATA_BYTES);
        continue;
      }
      const capacity = this.#stage ? this.#stage.length - this.#stageAt : 0;
      if (capacity < MAX_DATA_BYTES && capacity - this.#staged < rest.length) {
        // Grow the stage (to what this write needs, at least 16 KiB, by doubling): a small
        // answer costs a small frame; once a frame went out full, the next ones start full
        // (no copies from a smaller stage to a larger one along each frame of a large body).
        const room = Math.min(
          MAX_DATA_BYTES,
          this.#sentFull
            ? MAX_DATA_BYTES
            : Math.max(16384, this.#staged + rest.length, 2 * this.#staged),
        );
        if (this.#stage) {
          const grown = new Uint8Array(this.#stageAt + room);
          grown.set(this.#stage.subarray(0, this.#stageAt + this.#staged));
          this.#stage = grown;
        } else {
          this.#stage = frameWithRoom(this.#requestId, this.#takeHead(), room);
          this.#stageAt = this.#stage.length - room;
        }
      }
      const n = Math.min(rest.length, MAX_DATA_BYTES - this.#staged);
      this.#stage!.set(rest.subarray(0, n), this.#stageAt + this.#staged);
      this.#staged += n;
      rest = rest.subarray(n);
      if (this.#staged === MAX_DATA_BYTES) {
        this.#sentFull = true;
        await this.#flush(false);
      }
    }
  }

  /** Sends what is gathered (and the head, if it is still pending) with the end, in one frame. */
  async end(): Promise<void> {
    if (this.#ended) return;
    if (this.#failure) throw this.#failure;
    await this.#flush(true);
  }

  /**
   * Sends what is gathered now (and the head, if it is still pending), without waiting for a
   * full frame: a live-output answer's chunks must not wait for 256 KiB of them.
   */
  async flush(): Promise<void> {
    await this.#flush(false);
    if (this.#failure) throw this.#failure;
  }

  /** Whether the end has been sent. */
  get ended(): boolean {
    return this.#ended;
  }

  /** The slot failed: pending and later writes reject with `error`. */
  fail(error: Error): void {
    this.#failure ??= error;
    this.#wake();
  }

  /** Sends the stage, or the head alone; with `end`, marked as the end (alone if need be). */
  async #flush(end: boolean): Promise<void> {
    let frame: Uint8Array;
    const length = this.#staged;
    if (this.#stage) {
      frame = this.#stage.subarray(0, this.#stageAt + length);
      this.#stage = null;
      this.#staged = 0;
    } else if (this.#head !== null || end) {
      frame = frameWithRoom(this.#requestId, this.#takeHead(), 0);
    } else {
      return;
    }
    if (end) markEnd(frame);
    await this.#frame(frame, length, end);
  }

  /** Sends one frame, waiting for credit when it carries bytes. */
  async #frame(
    frame: Uint8Array | readonly Uint8Array[],
    length: number,
    end: boolean,
  ): Promise<void> {
    while (length > 0 && this.#credit === 0 && !this.#failure) {
      await new Promise<void>((resolve) => (this.#waiter = resolve));
    }
    if (this.#failure) throw this.#failure;
    if (length > 0) (this.#credit--, this.#sentFrames++);
    this.sentBytes += length;
    if (end) this.#ended = true;
    if (frame instanceof Uint8Array) this.#sendFrame(frame);
    else this.#sendParts!(frame);
  }

  #wake(): void {
    const waiter = this.#waiter;
    this.#waiter = null;
    waiter?.();
  }
}
