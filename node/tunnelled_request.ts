/**
 * One request a Router tunnels through a node's slot, the node's side: the pipeline's input
 * made of its frames, and its answer sent back as frames (spec router §1.5, over link/frames.ts).
 *
 * ```
 *  request head ─▶ input: a body whose Content-Length fits one frame is taken whole as its
 *                  frames come (no Request, no stream: most requests, and one frame with the
 *                  head); any other is a Request whose body stream the frames feed
 *  answer: one that declares at most one frame of bytes (not live output) is read whole and
 *          sent with its head and end as one frame; any other streams (a live-output answer's
 *          head at once and each piece as it comes), then the end
 * ```
 *
 * Everything it sends goes to the connection it came on: an answer that ends after that
 * connection was cancelled or lost is dropped, never sent on the slot's next connection (where
 * the Router would take it for a violation).
 *
 * @module
 */
import { BodyReceiver } from "../link/body_receiver.ts";
import { BodySender } from "../link/body_sender.ts";
import {
  encodeMessage,
  type HeaderEntry,
  LinkMessageError,
  MAX_DATA_BYTES,
  type RequestHead,
} from "../link/messages.ts";
import type { WebSocketClient } from "../link/websocket_client.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { isLiveOutput } from "../protocol/live_output.ts";
import type { WholeBodyRequest } from "../server/execute/intake.ts";

/** One tunnelled request on a slot's connection. */
export class TunnelledRequest {
  /** The Router's request id. */
  readonly id: string;
  /** The request body, as its frames come. */
  readonly body: BodyReceiver;
  /** Aborts when the Router cancels the request or the connection is lost. */
  readonly abort: AbortController = new AbortController();
  /** The request's run: its answer written (the slot's next request waits for it). */
  task: Promise<void> = Promise.resolve();
  readonly #socket: WebSocketClient | null;
  #answer: BodySender | null = null;
  #failure: Error | null = null;
  #answered = false;

  /** A request that came on `socket` (`null`: nothing is sent). */
  constructor(id: string, socket: WebSocketClient | null) {
    this.id = id;
    this.#socket = socket;
    this.body = new BodyReceiver((frames) =>
      this.#send(encodeMessage({ t: "credit", request_id: id, frames }))
    );
  }

  /** Both ends passed: the request's body ended and its answer went out whole. */
  get done(): boolean {
    return this.#answered && this.body.ended;
  }

  /**
   * The pipeline's input for the request that `head` begins: a body that fits one frame by its
   * `Content-Length` as a {@linkcode WholeBodyRequest} taken from the frames as they come (past
   * its length it is cut off where the pipeline's stream reader would cut it off), any other as
   * a `Request` whose body stream the frames feed.
   */
  input(head: RequestHead, scheme: "http" | "https"): Request | WholeBodyRequest {
    const headers = new Headers();
    for (const [name, value] of head.headers) headers.append(name, value);
    const declared = headers.get("content-length");
    if (declared !== null && /^\d+$/.test(declared) && Number(declared) <= MAX_DATA_BYTES) {
      return {
        headers,
        bytes: () => this.body.whole(Number(declared)),
        discard: () => this.body.discard(),
        signal: this.abort.signal,
      };
    }
    if (!headers.has("host")) headers.set("host", "kcoral-tunnel");
    const init: RequestInit & { duplex: "half" } = {
      method: "POST",
      headers,
      body: this.body.stream,
      signal: this.abort.signal,
      duplex: "half",
    };
    return new Request(`${scheme}://kcoral-tunnel/execute`, init);
  }

  /**
   * The Router's `credit` for the answer; before the answer began, a violation
   * ({@linkcode LinkMessageError}).
   */
  credit(frames: number): void {
    if (!this.#answer) throw new LinkMessageError("credit before the answer");
    this.#answer.credit(frames);
  }

  /**
   * Sends `response` as the answer; `true` once it went out whole, `false` when the connection
   * went away or the answer's body failed (its stream is then cancelled).
   */
  async answer(response: Response): Promise<boolean> {
    // Each `set-cookie` apart; `forEach` rather than Deno's slower `Headers` iterator
    // (router/headers.ts).
    const headers: HeaderEntry[] = [];
    let contentType: string | null = null;
    let declared = NaN;
    response.headers.forEach((value, name) => {
      headers.push([name, value]);
      if (name === "content-type") contentType = value;
      else if (name === "content-length") declared = Number(value);
    });
    const answer = new BodySender(
      this.id,
      { status: response.status, headers },
      // `send` copies the frame: its memory goes back at once (protocol/bytes.ts).
      (frame) => (this.#send(frame), releaseBuffer(frame)),
      // Full frames of a large answer's chunks are masked from the chunk itself.
      (parts) => this.#socket?.sendParts(parts),
    );
    this.#answer = answer;
    if (this.#failure) answer.fail(this.#failure);
    try {
      const live = isLiveOutput(contentType);
      if (!live && declared <= MAX_DATA_BYTES) {
        // A declared length: read whole (not through `body`, which would make a stream) and
        // sent with the head and the end in one frame.
        const bytes = await response.bytes();
        if (bytes.length <= MAX_DATA_BYTES) answer.sendComplete(bytes);
        else await answer.write(bytes);
      } else {
        // A live-output answer's head and pieces go out as they come (others fill frames).
        if (live) answer.sendHead();
        for await (const chunk of response.body ?? []) {
          await answer.write(chunk);
          if (live) await answer.flush();
        }
      }
      await answer.end();
    } catch {
      // The slot went away mid-answer (cancel or lost connection), or the answer's body failed.
      await response.body?.cancel().catch(() => {});
      return false;
    }
    this.#answered = true;
    return true;
  }

  /**
   * The request ends without its answer (a cancel, a lost connection): its body's reader, its
   * answer and its run's signal fail with `tunnel: <reason>`.
   */
  fail(reason: string): void {
    const error = new Error(`tunnel: ${reason}`);
    this.#failure ??= error;
    this.body.fail(error);
    this.#answer?.fail(error);
    this.abort.abort(error);
  }

  /** Sends on this request's connection (nothing once it has closed). */
  #send(data: string | Uint8Array): void {
    try {
      this.#socket?.send(data);
    } catch {
      // closing: the close event ends the request
    }
  }
}
