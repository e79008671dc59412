/**
 * Exchange, the third stage of a routed `POST /execute` (spec router §2.2): the request through
 * the slot a lease holds, and the node's answer for the client. Nothing is ever replayed: once
 * the request head has gone to a node, a failure is a 502.
 *
 * ```
 *  a body read whole at intake: the head, the body and the end in one frame; any other: the
 *    head, then upload (router/upload.ts; concurrently: 413, 400, 408, 502)
 *  ─▶ the response head (502 when out of turn, not an answer's headers, or gone)
 *  ─▶ an answer of one frame (declared by its length, not live output) taken whole to the
 *     node's end and sent with its length; any other streamed to the client
 *  ─▶ node's end: the slot back to its FIFO (discarded when the upload had not finished)
 *  client gone (before the answer: noticed through ClientWatch; after: by the answer's stream)
 *    ─▶ cancel client_disconnected
 * ```
 *
 * @module
 */
import { MAX_DATA_BYTES, NODE_HEADER, type ResponseHead } from "../link/messages.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { isLiveOutput } from "../protocol/live_output.ts";
import { Rejection } from "../http/rejection.ts";
import { fieldLinesResponse } from "../http/http1_response.ts";
import { withWholeBody } from "../http/whole_body.ts";
import type { SlotLease } from "./connections.ts";
import { type FinishReason, type RequestTrace, routerRejections } from "./finish.ts";
import type { ForwardContext } from "./forward_context.ts";
import {
  DROPPED_REQUEST_HEADERS,
  DROPPED_RESPONSE_HEADERS,
  forwardedHeaders,
  forwardedResponseEntries,
  validHeaderEntries,
} from "./headers.ts";
import type { RoutedRequest } from "./intake.ts";
import { type RouterSlot, TunnelError, type TunnelExchange } from "./slot_link.ts";
import { uploadBody } from "./upload.ts";

/**
 * The node's answer to `routed` through the slot `lease` holds, to stream back; `null` when the
 * slot went away before anything was sent on it (a body read whole at intake: another slot may
 * take the request). Throws the {@linkcode Rejection} to answer; the lease is settled either way.
 */
export async function exchangeOnSlot(
  routed: RoutedRequest,
  lease: SlotLease,
  trace: RequestTrace,
  ctx: Pick<ForwardContext, "maxRequestBytes" | "clientWatch">,
): Promise<Response | null> {
  // The registry hands out the slots the hub registered, which are RouterSlots.
  const slot = lease.slot as RouterSlot;
  const { request, length, body: whole } = routed;
  const headers = forwardedHeaders(request.headers, DROPPED_REQUEST_HEADERS);
  headers.push(["x-request-id", trace.id]);
  if (length !== null) headers.push(["content-length", String(length)]);
  let exchange: TunnelExchange;
  try {
    exchange = slot.begin(trace.id, headers, length, whole);
  } catch (error) {
    if (!(error instanceof TunnelError)) throw error;
    lease.release(false);
    // Gone while its body was read: nothing was sent, so another slot may take the request.
    if (whole) return null;
    throw routerRejections.transport();
  }
  // Settles only with what ends the attempt before its answer: the upload's rejection, or the
  // client going away while the node works.
  const { promise: interrupted, resolve: interrupt, reject } = Promise.withResolvers<
    Rejection
  >();
  if (whole) trace.requestBytes = whole.length;
  else uploadBody(routed, exchange, trace, ctx).then((error) => error && interrupt(error), reject);
  const unwatch = ctx.clientWatch?.watch(request, () => interrupt(routerRejections.clientGone())) ??
    _unwatched;
  try {
    return await _answer(exchange, interrupted, lease, trace);
  } finally {
    unwatch(); // from here the answer's stream notices a client that goes away
  }
}

const _unwatched = () => {};

/** The node's answer for the client, once its head comes. */
async function _answer(
  exchange: TunnelExchange,
  interrupted: Promise<Rejection>,
  lease: SlotLease,
  trace: RequestTrace,
): Promise<Response> {
  let head: ResponseHead;
  try {
    // The head, or an upload that failed or a client that went away first.
    const first: ResponseHead | Rejection = await Promise.race([exchange.head, interrupted]);
    if (first instanceof Rejection) throw first;
    head = first;
  } catch (error) {
    const failure = error instanceof Rejection
      ? error
      : error instanceof TunnelError
      ? routerRejections.transport(error.reason)
      : null;
    if (!failure) throw error;
    exchange.cancel(_cancelReason(failure.reason)); // a no-op once the slot is gone
    lease.release(false);
    throw failure;
  }
  // The entries themselves go to the client's Response: a repeated header stays repeated.
  const responseHeaders = forwardedResponseEntries(head.headers, DROPPED_RESPONSE_HEADERS);
  if (!validHeaderEntries(responseHeaders)) {
    // Headers no HTTP answer can carry (spec router §2.2 item 7: not decodable).
    exchange.cancel("invalid_response");
    lease.release(false);
    throw routerRejections.transport("invalid_response");
  }
  responseHeaders.push([NODE_HEADER, lease.nodeId], ["x-request-id", trace.id]);
  trace.status = head.status;
  if (head.status === 503) lease.markSaturated();
  // 204, 205 and 304 get no body; the node's bytes are still read to its end, and dropped.
  const bodyless = _NULL_BODY_STATUSES.has(head.status);
  const respond = (body: Uint8Array<ArrayBuffer> | ReadableStream<Uint8Array> | null) =>
    fieldLinesResponse(body, head.status, [...responseHeaders]);
  if (_declaresOneFrame(head)) {
    const whole = await _wholeAnswer(exchange, interrupted, lease, trace);
    if (whole) {
      if (bodyless) return respond(null);
      responseHeaders.push(["content-length", String(whole.length)]);
      return withWholeBody(respond(whole), whole);
    }
  }
  const body = _responseBody(exchange, interrupted, lease, trace);
  if (bodyless) {
    body.pipeTo(new WritableStream()).catch(() => {});
    return respond(null);
  }
  // Streamed to the node's end, chunked (spec router §2.2 item 8): each chunk written before
  // the next is read (http/http1_response.ts).
  responseHeaders.push(["transfer-encoding", "chunked"]);
  return respond(body);
}

/** Statuses whose responses have no body (a node's status is 200–599: no 1xx comes). */
const _NULL_BODY_STATUSES = new Set([204, 205, 304]);

/**
 * Whether the node declared an answer of at most one frame of bytes (its `Content-Length`; a
 * node's server declares one only for an answer it holds whole), other than live output.
 */
function _declaresOneFrame(head: ResponseHead): boolean {
  let declared = false;
  for (const [name, value] of head.headers) {
    const lower = name.toLowerCase();
    if (lower === "content-type" && isLiveOutput(value)) return false;
    if (lower === "content-length") {
      declared = /^\d{1,7}$/.test(value) && Number(value) <= MAX_DATA_BYTES;
    }
  }
  return declared;
}

/**
 * An answer of at most one frame of bytes, taken whole up to the node's end so the client gets
 * it with its length in one write (docs/decisions/router-trivial-latency.md); `null` once it is
 * larger (then streamed). Failures are answered as before the head.
 */
async function _wholeAnswer(
  exchange: TunnelExchange,
  interrupted: Promise<Rejection>,
  lease: SlotLease,
  trace: RequestTrace,
): Promise<Uint8Array<ArrayBuffer> | null> {
  let answer: Uint8Array | null | Rejection;
  try {
    answer = await Promise.race([exchange.body.wholeIfWithin(MAX_DATA_BYTES), interrupted]);
  } catch (error) {
    lease.release(false);
    throw routerRejections.transport(_failureReason(error));
  }
  if (answer instanceof Rejection) {
    exchange.cancel(_cancelReason(answer.reason));
    lease.release(false);
    throw answer;
  }
  if (answer === null) return null;
  trace.responseBytes = answer.length;
  _answered(exchange, lease, trace);
  return answer as Uint8Array<ArrayBuffer>;
}

/**
 * The node's `end` has come: the slot goes back reusable only if the upload had ended too (its
 * `end` was sent before the node's could come back, unless the node answered early).
 */
function _answered(exchange: TunnelExchange, lease: SlotLease, trace: RequestTrace): void {
  if (exchange.upload.ended) _settle(exchange, lease, trace, "completed", true);
  else _settle(exchange, lease, trace, "completed", false, "request_rejected");
}

/** The attempt is over: its reason, the slot cancelled if need be and released, its log line. */
function _settle(
  exchange: TunnelExchange,
  lease: SlotLease,
  trace: RequestTrace,
  reason: FinishReason,
  reusable: boolean,
  cancel?: string,
): void {
  trace.reason = reason;
  if (cancel) exchange.cancel(_cancelReason(cancel));
  lease.release(reusable);
  trace.finish(); // at once, not on a timer (decisions.md, "The Router finishes an attempt …")
}

/** The finish reason of a slot that failed with `error`. */
function _failureReason(error: unknown): FinishReason {
  return error instanceof TunnelError ? error.reason : "tunnel_disconnected";
}

/** The `cancel` reason the node gets for an attempt that ended with `reason`. */
function _cancelReason(reason: string) {
  return reason === "client_disconnected"
    ? "client_disconnected"
    : reason === "invalid_response"
    ? "invalid_response"
    : "request_rejected";
}

/** What a cut-short answer's stream fails with (the `request_finished` line gives the reason). */
const _CUT_SHORT = "";

/** The node's body for the client; the slot's fate is settled when it ends either way. */
function _responseBody(
  exchange: TunnelExchange,
  interrupted: Promise<Rejection>,
  lease: SlotLease,
  trace: RequestTrace,
): ReadableStream<Uint8Array> {
  const reader = exchange.body.stream.getReader();
  // An upload failing while the answer streams ends the answer (the client sees it cut).
  let settled = false;
  const settle = (reason: FinishReason, reusable: boolean, cancel?: string) => {
    if (settled) return;
    settled = true;
    _settle(exchange, lease, trace, reason, reusable, cancel);
  };
  // The chunk last handed to the client: written once the next is asked for
  // (http/http1_response.ts), so its memory goes back at once (protocol/bytes.ts says why).
  let handed: Uint8Array | null = null;
  const release = () => {
    if (handed) releaseBuffer(handed);
    handed = null;
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      release();
      let next: ReadableStreamReadResult<Uint8Array> | Rejection;
      try {
        next = await Promise.race([reader.read(), interrupted]);
      } catch (error) {
        settle(_failureReason(error), false); // the slot failed mid-answer
        controller.error(_CUT_SHORT);
        return;
      }
      if (next instanceof Rejection) {
        settle(next.reason as FinishReason, false, next.reason);
        controller.error(_CUT_SHORT);
        return;
      }
      if (next.done) {
        // The client's answer is complete first (the bookkeeping and its log line come after).
        controller.close();
        if (!settled) (settled = true, _answered(exchange, lease, trace));
        return;
      }
      trace.responseBytes += next.value.length;
      controller.enqueue(next.value);
      handed = next.value;
    },
    cancel() {
      settle("client_disconnected", false, "client_disconnected");
    },
  }, { highWaterMark: 0 });
}
