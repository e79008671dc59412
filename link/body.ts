/**
 * A body through a node-link slot, both ends (link/messages.ts): the sender cuts it into
 * data frames of at most 256 KiB and sends one only while it holds credit; the receiver hands
 * frames to its reader as a `ReadableStream`, or, for a small body, takes them whole as they come
 * (no stream), and returns credit as they are read. Neither end holds more than
 * {@linkcode CREDIT_WINDOW} frames of one body, however slow the other side's reader: what bounds
 * the Router's memory per request (a WebSocket has no back-pressure of its own). The Router's
 * slots and the server's node link both use these.
 *
 * ```
 *  sender                                   receiver
 *   write(chunk) ──data (credit − 1)──▶      push(bytes) ─▶ queue ─▶ reader pulls
 *                ◀──credit n──────────        every window/2 frames read
 *   end()        ──end──────────────▶        end() ─▶ stream closes after the queue
 *                                            (whole(limit): frames taken as they come,
 *                                             the bytes at end)
 * ```
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import { CREDIT_WINDOW, encodeDataFrame, LinkMessageError, MAX_DATA_BYTES } from "./messages.ts";

/** Bytes before a data frame's payload: the frame type and the request id. */
export const DATA_HEADER_BYTES = 37;

/**
 * Sends one body as data frames, never more than the credit the receiver gave.
 *
 * @example
 * ```ts
 * import { BodySender } from "./body.ts";
 *
 * const frames: number[] = [];
 * const id = "0f6c2b4e-1111-4222-8333-444455556666";
 * const sender = new BodySender(id, (frame) => frames.push(frame.length - 37), () => frames.push(-1));
 * await sender.write(new Uint8Array(300_000));
 * await sender.end();
 * if (frames.join() !== "262144,37856,-1") throw new Error(frames.join());
 * ```
 */
export class BodySender {
  readonly #requestId: string;
  /** A data frame's header for this body, made at its first data frame (a whole exchange has none). */
  #headerBytes: Uint8Array | null = null;
  readonly #sendFrame: (frame: Uint8Array) => void;
  readonly #sendEnd: () => void;
  readonly #sendParts: ((parts: readonly Uint8Array[]) => void) | null;
  #credit = CREDIT_WINDOW;
  #granted = 0;
  #sentFrames = 0;
  #stage: Uint8Array | null = null;
  #staged = 0;
  #sentFull = false;
  #waiter: (() => void) | null = null;
  #failure: Error | null = null;
  #ended = false;
  /** Body bytes sent so far. */
  sentBytes = 0;

  /**
   * A sender of the body of request `requestId`: `sendFrame` sends one whole data frame (it
   * may keep the buffer: each frame is a new one), `sendEnd` the `end` message. `sendParts`, if
   * given, sends one data frame given as parts (its header, then a slice of a written chunk)
   * and copies them before it returns: full frames of a large chunk then go out without being
   * copied into a frame of their own first.
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => {});
   * if (sender.sentBytes !== 0) throw new Error();
   * ```
   */
  constructor(
    requestId: string,
    sendFrame: (frame: Uint8Array) => void,
    sendEnd: () => void,
    sendParts?: (parts: readonly Uint8Array[]) => void,
  ) {
    this.#requestId = requestId;
    this.#sendFrame = sendFrame;
    this.#sendEnd = sendEnd;
    this.#sendParts = sendParts ?? null;
  }

  #header(): Uint8Array {
    return this.#headerBytes ??= encodeDataFrame(this.#requestId, new Uint8Array(0));
  }

  /**
   * A new data frame of this body with room for `capacity` payload bytes (at most 256 KiB, the
   * default) after its header (at {@linkcode DATA_HEADER_BYTES}): fill it in place (e.g. with
   * a BYOB read) and pass it to {@linkcode BodySender.sendFilled}. Size it to the payload
   * expected: a new buffer is zeroed, which costs more than the bytes it will carry.
   *
   * @example
   * ```ts
   * import { BodySender, DATA_HEADER_BYTES } from "./body.ts";
   *
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => {});
   * const frame = sender.newFrame();
   * if (frame[0] !== 1 || frame.length !== DATA_HEADER_BYTES + 262144) throw new Error();
   * if (sender.newFrame(100).length !== DATA_HEADER_BYTES + 100) throw new Error();
   * ```
   */
  newFrame(capacity: number = MAX_DATA_BYTES): Uint8Array<ArrayBuffer> {
    const frame = new Uint8Array(DATA_HEADER_BYTES + Math.min(capacity, MAX_DATA_BYTES));
    frame.set(this.#header());
    return frame;
  }

  /**
   * Sends a frame from {@linkcode BodySender.newFrame} (or a frame over the same memory) that
   * holds `length` bytes of payload, once there is credit for it.
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * let sent = 0;
   * const sender = new BodySender(
   *   "0f6c2b4e-1111-4222-8333-444455556666",
   *   (frame) => (sent = frame.length),
   *   () => {},
   * );
   * const frame = sender.newFrame();
   * frame.fill(7, 37, 47);
   * await sender.sendFilled(frame, 10);
   * if (sent !== 47 || sender.sentBytes !== 10) throw new Error();
   * ```
   */
  async sendFilled(frame: Uint8Array, length: number): Promise<void> {
    await this.#flush();
    await this.#frame(frame.subarray(0, DATA_HEADER_BYTES + length), length);
  }

  /**
   * The receiver's `credit` message. More than it has been sent in all is a violation
   * ({@linkcode LinkMessageError}).
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => {});
   * try {
   *   sender.credit(1); // nothing was sent yet
   *   throw new Error("accepted");
   * } catch (error) {
   *   if (!(error instanceof Error) || error.name !== "LinkMessageError") throw error;
   * }
   * ```
   */
  credit(frames: number): void {
    this.#granted += frames;
    if (this.#granted > this.#sentFrames) {
      throw new LinkMessageError("credit for data frames that were never sent");
    }
    this.#credit += frames;
    this.#wake();
  }

  /**
   * Sends `chunk`, copied into frames of at most 256 KiB (small chunks are gathered into one).
   * Resolves once it is handed to the connection; rejects once the slot failed.
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * let frames = 0;
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => frames++, () => {});
   * for (let i = 0; i < 4; i++) await sender.write(new Uint8Array(1000));
   * await sender.end();
   * if (frames !== 1 || sender.sentBytes !== 4000) throw new Error();
   * ```
   */
  async write(chunk: Uint8Array): Promise<void> {
    let rest = chunk;
    while (rest.length > 0) {
      if (this.#failure) throw this.#failure;
      if (this.#sendParts && this.#staged === 0 && rest.length >= MAX_DATA_BYTES) {
        // A full frame straight from the chunk, as parts (no frame of its own to copy into).
        await this.#frame([this.#header(), rest.subarray(0, MAX_DATA_BYTES)], MAX_DATA_BYTES);
        this.#sentFull = true;
        rest = rest.subarray(MAX_DATA_BYTES);
        continue;
      }
      const capacity = (this.#stage?.length ?? DATA_HEADER_BYTES) - DATA_HEADER_BYTES;
      if (capacity < MAX_DATA_BYTES && capacity - this.#staged < rest.length) {
        // Grow the stage (to what this write needs, at least 16 KiB, by doubling): a small
        // answer costs a small frame; once a frame went out full, the next ones start full
        // (no copies from a smaller stage to a larger one along each frame of a large body).
        const grown = this.newFrame(
          this.#sentFull
            ? MAX_DATA_BYTES
            : Math.max(16384, this.#staged + rest.length, 2 * this.#staged),
        );
        if (this.#stage) grown.set(this.#stage.subarray(0, DATA_HEADER_BYTES + this.#staged));
        this.#stage = grown;
      }
      const stage = this.#stage!;
      const n = Math.min(rest.length, MAX_DATA_BYTES - this.#staged);
      stage.set(rest.subarray(0, n), DATA_HEADER_BYTES + this.#staged);
      this.#staged += n;
      rest = rest.subarray(n);
      if (this.#staged === MAX_DATA_BYTES) {
        this.#sentFull = true;
        await this.#flush();
      }
    }
  }

  /**
   * Sends what is gathered and then `end`.
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * let ended = false;
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => (ended = true));
   * await sender.end();
   * if (!ended) throw new Error();
   * ```
   */
  async end(): Promise<void> {
    if (this.#ended) return;
    await this.#flush();
    if (this.#failure) throw this.#failure;
    this.#ended = true;
    this.#sendEnd();
  }

  /**
   * Sends what is gathered now, without waiting for a full frame (a live-output answer's
   * chunks must not wait for 256 KiB of them).
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * let frames = 0;
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => frames++, () => {});
   * await sender.write(new Uint8Array(10));
   * await sender.flush();
   * if (frames !== 1) throw new Error();
   * ```
   */
  async flush(): Promise<void> {
    await this.#flush();
    if (this.#failure) throw this.#failure;
  }

  /** Whether `end` has been sent. */
  get ended(): boolean {
    return this.#ended;
  }

  /**
   * The whole body, `length` bytes, goes out with its head and its end in one whole frame
   * (link/messages.ts): it counts as sent and ended, and this sender sends nothing. Throws
   * the slot's failure once it has failed (the frame must not be sent then).
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => {});
   * sender.sentWhole(12);
   * if (!sender.ended || sender.sentBytes !== 12) throw new Error();
   * ```
   */
  sentWhole(length: number): void {
    if (this.#failure) throw this.#failure;
    if (this.#ended || this.#sentFrames > 0 || this.#staged > 0) {
      throw new Error("the body is already being sent frame by frame");
    }
    this.sentBytes = length;
    this.#ended = true;
  }

  /**
   * The slot failed: pending and later writes reject with `error`.
   *
   * @example
   * ```ts
   * import { BodySender } from "./body.ts";
   *
   * const sender = new BodySender("0f6c2b4e-1111-4222-8333-444455556666", () => {}, () => {});
   * sender.fail(new Error("gone"));
   * const failed = await sender.write(new Uint8Array(1)).then(() => false, () => true);
   * if (!failed) throw new Error();
   * ```
   */
  fail(error: Error): void {
    this.#failure ??= error;
    this.#wake();
  }

  async #flush(): Promise<void> {
    if (this.#staged === 0) return;
    const frame = this.#stage!.subarray(0, DATA_HEADER_BYTES + this.#staged);
    const length = this.#staged;
    this.#stage = null;
    this.#staged = 0;
    await this.#frame(frame, length);
  }

  async #frame(frame: Uint8Array | readonly Uint8Array[], length: number): Promise<void> {
    while (this.#credit === 0 && !this.#failure) {
      await new Promise<void>((resolve) => (this.#waiter = resolve));
    }
    if (this.#failure) throw this.#failure;
    this.#credit--;
    this.#sentFrames++;
    this.sentBytes += length;
    if (frame instanceof Uint8Array) this.#sendFrame(frame);
    else this.#sendParts!(frame);
  }

  #wake(): void {
    const waiter = this.#waiter;
    this.#waiter = null;
    waiter?.();
  }
}

/**
 * Receives one body: data frames become a `ReadableStream` that its reader pulls; credit goes
 * back as frames are read.
 *
 * @example
 * ```ts
 * import { BodyReceiver } from "./body.ts";
 * import { CREDIT_WINDOW } from "./messages.ts";
 *
 * const grants: number[] = [];
 * const receiver = new BodyReceiver((n) => grants.push(n));
 * for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(new Uint8Array([i]));
 * const reader = receiver.stream.getReader();
 * for (let i = 0; i < CREDIT_WINDOW / 2; i++) await reader.read();
 * // Half the window read: that much credit goes back.
 * if (grants.join() !== String(CREDIT_WINDOW / 2)) throw new Error(grants.join());
 * receiver.end();
 * let rest = 0;
 * while (!(await reader.read()).done) rest++;
 * if (rest !== CREDIT_WINDOW / 2) throw new Error();
 * ```
 */
export class BodyReceiver {
  readonly #grant: (frames: number) => void;
  readonly #queue: Uint8Array[] = [];
  #stream: ReadableStream<Uint8Array> | null = null;
  #whole: _WholeTake | null = null;
  #within: _WithinWait | null = null;
  #queuedBytes = 0;
  #outstanding = CREDIT_WINDOW;
  #read = 0;
  #ended = false;
  #failure: Error | null = null;
  #pull: (() => void) | null = null;
  #cancelled = false;
  /** Body bytes received so far. */
  receivedBytes = 0;
  /** Called once when the reader cancels the stream (e.g. the HTTP client went away). */
  onCancel: ((reason: unknown) => void) | null = null;

  /**
   * `grant` sends a `credit` message for that many frames.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * if (receiver.receivedBytes !== 0) throw new Error();
   * ```
   */
  constructor(grant: (frames: number) => void) {
    this.#grant = grant;
  }

  /**
   * The body, for its reader (made on first use; not with {@linkcode BodyReceiver.whole}).
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.push(new Uint8Array([1, 2]));
   * receiver.end();
   * if ((await new Response(receiver.stream).bytes()).length !== 2) throw new Error();
   * ```
   */
  get stream(): ReadableStream<Uint8Array> {
    if (this.#whole) throw new Error("the body is being taken whole");
    return this.#stream ??= new ReadableStream<Uint8Array>({
      pull: (controller) => this.#deliver(controller),
      cancel: (reason) => this.#cancel(reason),
    }, { highWaterMark: 0 });
  }

  /**
   * The whole body, without a stream (a small body): frames are taken as they come, credit goes
   * back as the stream's reader would return it, and the promise resolves at `end` with the
   * bytes (one frame's own bytes when there was one). Once more than `limit` bytes came, it
   * resolves at once with them, and the rest of the body is dropped, as a stream's reader that
   * stops there would leave it. Rejects when the slot fails before the end. One reader per body:
   * this or {@linkcode BodyReceiver.stream}.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.push(new Uint8Array([1, 2, 3]));
   * const body = receiver.whole(3);
   * receiver.end();
   * if ((await body).length !== 3) throw new Error();
   * ```
   */
  whole(limit: number): Promise<Uint8Array> {
    if (this.#stream || this.#whole || this.#within) {
      throw new Error("the body already has a reader");
    }
    if (this.#cancelled) throw new Error("the body was discarded");
    const { promise, resolve, reject } = Promise.withResolvers<Uint8Array>();
    this.#whole = { limit, chunks: [], bytes: 0, resolve, reject, settled: false };
    for (const chunk of this.#queue.splice(0)) this.#take(chunk);
    this.#settleWhole();
    return promise;
  }

  /**
   * The whole body if it turns out small: resolves with its bytes when `end` comes while at most
   * `limit` bytes have come, and with `null`, taking nothing, as soon as more have come or the
   * sender has used up its credit (the body is then for {@linkcode BodyReceiver.stream}, which
   * delivers every frame in order). Rejects when the slot fails before either. For an answer
   * that is usually small and must stay whole whatever size it declared.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const small = new BodyReceiver(() => {});
   * const whole = small.wholeIfWithin(4);
   * small.push(new Uint8Array([1, 2, 3]));
   * small.end();
   * if ((await whole)?.length !== 3) throw new Error();
   *
   * const large = new BodyReceiver(() => {});
   * const none = large.wholeIfWithin(4);
   * large.push(new Uint8Array(5));
   * large.end();
   * if ((await none) !== null) throw new Error();
   * if ((await new Response(large.stream).bytes()).length !== 5) throw new Error();
   * ```
   */
  wholeIfWithin(limit: number): Promise<Uint8Array | null> {
    if (this.#stream || this.#whole || this.#within) {
      throw new Error("the body already has a reader");
    }
    const { promise, resolve, reject } = Promise.withResolvers<Uint8Array | null>();
    this.#within = { limit, resolve, reject };
    this.#settleWithin();
    return promise;
  }

  /**
   * The reader gives the body up (as cancelling its stream does): later frames are dropped
   * and no more credit goes back. A pending {@linkcode BodyReceiver.whole} is left unsettled.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.discard();
   * receiver.push(new Uint8Array(1));
   * if (!receiver.cancelled || receiver.receivedBytes !== 1) throw new Error();
   * ```
   */
  discard(reason?: unknown): void {
    if (this.#whole) this.#whole.settled = true;
    this.#stream?.cancel(reason).catch(() => {});
    this.#cancel(reason);
  }

  /** Whether the reader cancelled the stream. */
  get cancelled(): boolean {
    return this.#cancelled;
  }

  /**
   * One data frame's bytes. A frame beyond the credit given, or after `end`, is a violation
   * ({@linkcode LinkMessageError}).
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.end();
   * try {
   *   receiver.push(new Uint8Array(1));
   *   throw new Error("accepted");
   * } catch (error) {
   *   if (!(error instanceof Error) || error.name !== "LinkMessageError") throw error;
   * }
   * ```
   */
  push(bytes: Uint8Array): void {
    if (this.#ended) throw new LinkMessageError("data after the end of the body");
    if (this.#outstanding === 0) throw new LinkMessageError("data frame without credit");
    this.#outstanding--;
    this.receivedBytes += bytes.length;
    if (this.#cancelled) return;
    if (this.#whole) {
      this.#take(bytes);
      this.#settleWhole();
      return;
    }
    this.#queue.push(bytes);
    this.#queuedBytes += bytes.length;
    this.#settleWithin();
    this.#wake();
  }

  /**
   * The body is complete: the stream closes once its reader has read the rest.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.end();
   * if ((await new Response(receiver.stream).arrayBuffer()).byteLength !== 0) throw new Error();
   * ```
   */
  end(): void {
    if (this.#ended) throw new LinkMessageError("a second end of the body");
    this.#ended = true;
    this.#settleWhole();
    this.#settleWithin();
    this.#wake();
  }

  /** Whether `end` has come. */
  get ended(): boolean {
    return this.#ended;
  }

  /**
   * The slot failed before the end: the reader gets `error`.
   *
   * @example
   * ```ts
   * import { BodyReceiver } from "./body.ts";
   *
   * const receiver = new BodyReceiver(() => {});
   * receiver.fail(new Error("gone"));
   * const failed = await new Response(receiver.stream).arrayBuffer().then(() => false, () => true);
   * if (!failed) throw new Error();
   * ```
   */
  fail(error: Error): void {
    if (this.#ended) return;
    this.#failure ??= error;
    this.#settleWhole();
    this.#settleWithin();
    this.#wake();
  }

  #cancel(reason: unknown): void {
    if (this.#cancelled) return;
    this.#cancelled = true;
    this.onCancel?.(reason);
  }

  /** A frame taken by {@linkcode BodyReceiver.whole}: counted as read, as a stream pull counts it. */
  #take(chunk: Uint8Array): void {
    const whole = this.#whole!;
    if (whole.settled) return;
    whole.chunks.push(chunk);
    whole.bytes += chunk.length;
    this.#credit();
  }

  /** Resolves or rejects a pending {@linkcode BodyReceiver.whole} once its body is decided. */
  #settleWhole(): void {
    const whole = this.#whole;
    if (!whole || whole.settled) return;
    const over = whole.bytes > whole.limit;
    if (!over && !this.#ended) {
      if (this.#failure) {
        whole.settled = true;
        whole.reject(this.#failure);
      }
      return;
    }
    whole.settled = true;
    // Past the limit, the rest is not wanted (a stream's reader would have cancelled).
    if (over) this.#cancel(undefined);
    const { chunks } = whole;
    whole.resolve(
      chunks.length === 1
        ? chunks[0]
        : chunks.length === 0
        ? new Uint8Array(0)
        : concatBytes(chunks),
    );
  }

  /** Resolves or rejects a pending {@linkcode BodyReceiver.wholeIfWithin} once it is decided. */
  #settleWithin(): void {
    const within = this.#within;
    if (!within) return;
    const over = this.#queuedBytes > within.limit;
    if (this.#ended && !over) {
      this.#within = null;
      const chunks = this.#queue.splice(0);
      this.#queuedBytes = 0;
      within.resolve(chunks.length === 1 ? chunks[0] : concatBytes(chunks));
    } else if (over || (this.#outstanding === 0 && !this.#ended)) {
      this.#within = null;
      within.resolve(null);
    } else if (this.#failure) {
      this.#within = null;
      within.reject(this.#failure);
    }
  }

  /** One more frame read: every half window, that much credit goes back (none after `end`). */
  #credit(): void {
    if (++this.#read >= CREDIT_WINDOW / 2 && !this.#ended) {
      this.#outstanding += this.#read;
      this.#grant(this.#read);
      this.#read = 0;
    }
  }

  async #deliver(controller: ReadableStreamDefaultController<Uint8Array>): Promise<void> {
    while (this.#queue.length === 0 && !this.#ended && !this.#failure) {
      await new Promise<void>((resolve) => (this.#pull = resolve));
    }
    const next = this.#queue.shift();
    if (next) {
      this.#queuedBytes -= next.length;
      controller.enqueue(next);
      this.#credit();
    } else if (this.#failure) {
      controller.error(this.#failure);
    } else {
      controller.close();
    }
  }

  #wake(): void {
    const pull = this.#pull;
    this.#pull = null;
    pull?.();
  }
}

/** A pending {@linkcode BodyReceiver.wholeIfWithin}. */
interface _WithinWait {
  readonly limit: number;
  readonly resolve: (body: Uint8Array | null) => void;
  readonly reject: (error: Error) => void;
}

/** A pending {@linkcode BodyReceiver.whole}. */
interface _WholeTake {
  readonly limit: number;
  readonly chunks: Uint8Array[];
  bytes: number;
  readonly resolve: (body: Uint8Array) => void;
  readonly reject: (error: Error) => void;
  settled: boolean;
}
