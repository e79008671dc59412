/**
 * The receiving end of a body through a node-link slot (link/frames.ts): the bytes of its frames
 * handed to a reader as a `ReadableStream`, or, for a small body, taken whole as they come (no
 * stream), with credit returned as they are read: every half window, so the sender
 * (link/body_sender.ts) never has more than {@linkcode CREDIT_WINDOW} frames of bytes in flight.
 *
 * ```
 *   receive(bytes, end) ─▶ queue ─▶ the stream's reader pulls ─▶ credit n every window/2 frames
 *   whole(limit)           frames taken as they come, the bytes at the end (a small request)
 *   wholeIfWithin(limit)   the bytes at the end if they stay small, else the stream (an answer)
 * ```
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import { CREDIT_WINDOW, LinkMessageError } from "./messages.ts";

/**
 * Receives one body: the bytes of its frames become a `ReadableStream` that its reader pulls;
 * credit goes back as frames are read.
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

  /** `grant` sends a `credit` message for that many frames. */
  constructor(grant: (frames: number) => void) {
    this.#grant = grant;
  }

  /** The body, for its reader (made on first use; not with {@linkcode BodyReceiver.whole}). */
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
   * One frame's body bytes (at least one). A frame beyond the credit given, or after `end`, is a
   * violation
   * ({@linkcode LinkMessageError}).
   */
  push(bytes: Uint8Array): void {
    if (this.#ended) throw new LinkMessageError("data after the end of the body");
    if (this.#outstanding === 0) throw new LinkMessageError("frame of bytes without credit");
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
   * One frame's body bytes (there may be none) and whether it ends the body: what
   * {@linkcode BodyReceiver.push} and {@linkcode BodyReceiver.end} do, for a frame as it comes.
   */
  receive(bytes: Uint8Array, end: boolean): void {
    if (bytes.length > 0) this.push(bytes);
    else if (this.#ended) throw new LinkMessageError("a frame after the end of the body");
    if (end) this.end();
  }

  /** The body is complete: the stream closes once its reader has read the rest. */
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

  /** The slot failed before the end: the reader gets `error`. */
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
