/**
 * The client's body to the node, inside the exchange stage of a routed `POST /execute`
 * (router/exchange.ts), for a body not read whole at intake (that one goes with the head): read
 * straight into frames as it arrives (413 past the limit, 400 when it fails or is not its declared
 * length, 408 when it stalls, 502 when the slot fails), then the end.
 *
 * @module
 */
import { MAX_DATA_BYTES } from "../link/messages.ts";
import type { Rejection } from "../http/rejection.ts";
import type { StallWatch } from "../http/stall_watch.ts";
import type { ForwardContext } from "./forward_context.ts";
import { type RequestTrace, routerRejections } from "./finish.ts";
import type { RoutedRequest } from "./intake.ts";
import { TunnelError, type TunnelExchange } from "./slot_link.ts";

/**
 * Sends the client's body on `exchange` (`trace.requestBytes` follows it); resolves with the
 * rejection that ends the attempt, or `null` once `end` went out.
 *
 * @example
 * ```ts
 * import type { TunnelExchange } from "./slot_link.ts";
 * import type { RequestTrace } from "./finish.ts";
 * import type { RoutedRequest } from "./intake.ts";
 * import { uploadBody } from "./upload.ts";
 *
 * async function send(routed: RoutedRequest, exchange: TunnelExchange, trace: RequestTrace) {
 *   const failure = await uploadBody(routed, exchange, trace, { maxRequestBytes: 1 << 20 });
 *   if (failure) throw failure; // the stage's answer instead of the node's
 * }
 * ```
 */
export async function uploadBody(
  routed: RoutedRequest,
  exchange: TunnelExchange,
  trace: RequestTrace,
  ctx: Pick<ForwardContext, "maxRequestBytes" | "bodyWatch" | "clientWatch">,
): Promise<Rejection | null> {
  const { request, length } = routed;
  try {
    const body = request.body;
    const total = !body
      ? 0
      : await _sendBody(body, exchange, length, ctx.maxRequestBytes, trace, ctx.bodyWatch);
    if (typeof total !== "number") return total;
    if (length !== null && total !== length) return routerRejections.lengthMismatch();
    // A large body is read only once a slot is free: a client that left while it waited is seen
    // now, and its request is cancelled before its body ends on the node (so it never starts).
    if (body && ctx.clientWatch?.present(routed.clientPort) === false) {
      return routerRejections.clientGone();
    }
    await exchange.upload.end();
    trace.requestBytes = exchange.upload.sentBytes;
    return null;
  } catch (error) {
    if (!(error instanceof TunnelError)) throw error;
    return routerRejections.uploadTransport();
  }
}

/**
 * Reads the client's body straight into frames (a BYOB read fills each frame's bytes in place:
 * reading a large body chunk by chunk costs far more) and sends them; the byte count, or the
 * rejection to answer.
 */
async function _sendBody(
  body: ReadableStream<Uint8Array>,
  exchange: TunnelExchange,
  length: number | null,
  limit: number,
  trace: RequestTrace,
  bodyWatch?: StallWatch,
): Promise<number | Rejection> {
  let byob: ReadableStreamBYOBReader | null = null;
  try {
    byob = body.getReader({ mode: "byob" });
  } catch {
    // not a byte stream: chunk by chunk below
  }
  let total = 0;
  if (!byob) {
    for await (const chunk of body) {
      total += chunk.length;
      if (total > limit) return routerRejections.tooLarge();
      await exchange.upload.write(chunk);
      trace.requestBytes = exchange.upload.sentBytes;
    }
    return total;
  }
  // A body that stops arriving is cut (its reader cancelled): 408, and the slot is discarded.
  const reader = byob;
  let stalled = false;
  const watched = bodyWatch?.watch(() => {
    stalled = true;
    reader.cancel().catch(() => {});
  });
  try {
    for (let done = false; !done;) {
      // Sized to the rest of a body of known length (+1: the read that sees its end).
      let payload = exchange.upload.payloadBuffer(
        length === null ? MAX_DATA_BYTES : Math.max(length - total, 0) + 1,
      );
      // A read moves the memory (the old view reads as empty): its range, kept.
      const { byteOffset, length: capacity } = payload;
      let filled = 0;
      while (filled < capacity) {
        let read: ReadableStreamReadResult<Uint8Array>;
        try {
          read = await byob.read(payload.subarray(filled));
        } catch {
          return stalled
            ? routerRejections.bodyTimeout(bodyWatch!.timeoutMs)
            : routerRejections.bodyFailed();
        }
        if (stalled) return routerRejections.bodyTimeout(bodyWatch!.timeoutMs);
        watched?.progress();
        if (read.value) {
          payload = new Uint8Array(read.value.buffer as ArrayBuffer, byteOffset, capacity);
          filled += read.value.length;
        }
        if (read.done) {
          done = true;
          break;
        }
      }
      total += filled;
      if (total > limit) return routerRejections.tooLarge();
      if (filled > 0) await exchange.upload.sendPayload(payload.subarray(0, filled));
      trace.requestBytes = exchange.upload.sentBytes;
    }
    return total;
  } finally {
    watched?.done();
    byob.releaseLock();
  }
}
