/**
 * The client's body to the node, inside the exchange stage of a routed `POST /execute`
 * (router/exchange.ts), for a body not read whole at intake (that one goes with the head): the
 * first frame's bytes read at intake, then the rest read straight into frames as it arrives (413
 * past the limit, 400 when it fails or is not its declared length, 408 when it stalls: the
 * connection's body timeout, 502 when the slot fails), then the end — unless the client has gone
 * by then, and its request is cancelled before it can start on the node.
 *
 * @module
 */
import { MAX_DATA_BYTES } from "../link/messages.ts";
import type { Rejection } from "../http/rejection.ts";
import type { ForwardContext } from "./forward_context.ts";
import { type RequestTrace, routerRejections } from "./finish.ts";
import { bodyReadRejection, readInto, type RoutedRequest } from "./intake.ts";
import { TunnelError, type TunnelExchange } from "./slot_link.ts";

/**
 * Sends the client's body on `exchange` (`trace.requestBytes` follows it); resolves with the
 * rejection that ends the attempt, or `null` once `end` went out.
 */
export async function uploadBody(
  routed: RoutedRequest,
  exchange: TunnelExchange,
  trace: RequestTrace,
  ctx: Pick<ForwardContext, "maxRequestBytes">,
): Promise<Rejection | null> {
  const { request, length, prefix } = routed;
  try {
    let total = 0;
    if (prefix && prefix.length > 0) {
      await exchange.upload.write(prefix);
      total = prefix.length;
      trace.requestBytes = exchange.upload.sentBytes;
    }
    const body = request.body;
    if (body) {
      const sent = await _sendBody(body, exchange, length, total, ctx.maxRequestBytes, trace);
      if (typeof sent !== "number") return sent;
      total = sent;
    }
    if (length !== null && total !== length) return routerRejections.lengthMismatch();
    // A client that left once its body had arrived: its request is cancelled before its body
    // ends on the node (so it never starts there).
    if (body && await _clientGone(request)) return routerRejections.clientGone();
    await exchange.upload.end();
    trace.requestBytes = exchange.upload.sentBytes;
    return null;
  } catch (error) {
    if (!(error instanceof TunnelError)) throw error;
    return routerRejections.uploadTransport();
  }
}

/**
 * Whether `request`'s client has gone, once its connection has had its turn: after the body's
 * end the connection keeps a read pending (http/http1_server.ts), which meets an end already
 * received at once and aborts the request's signal.
 */
async function _clientGone(request: Request): Promise<boolean> {
  if (!request.signal.aborted) await new Promise((resolve) => setTimeout(resolve, 0));
  return request.signal.aborted;
}

/**
 * Reads the client's body straight into frames (a BYOB read fills each frame's bytes in place:
 * reading a large body chunk by chunk costs far more) and sends them; the byte count (from
 * `total`, what went before), or the rejection to answer.
 */
async function _sendBody(
  body: ReadableStream<Uint8Array>,
  exchange: TunnelExchange,
  length: number | null,
  total: number,
  limit: number,
  trace: RequestTrace,
): Promise<number | Rejection> {
  let byob: ReadableStreamBYOBReader | null = null;
  try {
    byob = body.getReader({ mode: "byob" });
  } catch {
    // not a byte stream: chunk by chunk below
  }
  if (!byob) {
    try {
      for await (const chunk of body) {
        total += chunk.length;
        if (total > limit) return routerRejections.tooLarge();
        await exchange.upload.write(chunk);
        trace.requestBytes = exchange.upload.sentBytes;
      }
    } catch (error) {
      if (error instanceof TunnelError) throw error;
      return bodyReadRejection(error);
    }
    return total;
  }
  try {
    for (let done = false; !done;) {
      // Sized to the rest of a body of known length (+1: the read that sees its end).
      const payload = exchange.upload.payloadBuffer(
        length === null ? MAX_DATA_BYTES : Math.max(length - total, 0) + 1,
      );
      let bytes: Uint8Array;
      try {
        ({ bytes, done } = await readInto(byob, payload));
      } catch (error) {
        return bodyReadRejection(error);
      }
      total += bytes.length;
      if (total > limit) return routerRejections.tooLarge();
      if (bytes.length > 0) await exchange.upload.sendPayload(bytes);
      trace.requestBytes = exchange.upload.sentBytes;
    }
    return total;
  } finally {
    byob.releaseLock();
  }
}
