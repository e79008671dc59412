/**
 * Admission, the second stage of a routed `POST /execute` (spec router §2.3, §3): a slot for the
 * request. A free one is taken at once (`NodeRegistry.tryAcquire`, no promise); only a request
 * that must wait goes through the queue (router/admission_queue.ts): 503 `router_busy` when it
 * is full or the Router is stopping, 503 `no_node` when the wait ends. A client that leaves while
 * its request waits gives its place up (noticed through its signal: the connection's end aborts
 * it once the body has arrived, http/http1_server.ts; a body still arriving is read only once a
 * slot is taken, and fails then).
 *
 * @module
 */
import type { Rejection } from "../http/rejection.ts";
import { RouterStopping } from "./admission_queue.ts";
import type { SlotLease } from "./connections.ts";
import { type RequestTrace, routerRejections } from "./finish.ts";
import type { ForwardContext } from "./forward_context.ts";
import type { RoutedRequest } from "./intake.ts";

/**
 * A slot for `routed`, at once or after its wait in the queue (added to `trace.queueWaitMs`);
 * throws the {@linkcode Rejection} to answer.
 */
export function admitRequest(
  routed: RoutedRequest,
  trace: RequestTrace,
  ctx: Pick<ForwardContext, "registry">,
): SlotLease | Promise<SlotLease> {
  return ctx.registry.tryAcquire(routed.preferred) ?? _waitForSlot(routed, trace, ctx);
}

async function _waitForSlot(
  routed: RoutedRequest,
  trace: RequestTrace,
  ctx: Pick<ForwardContext, "registry">,
): Promise<SlotLease> {
  const { request } = routed;
  const queued = performance.now();
  try {
    return await ctx.registry.acquire(routed.preferred, () => request.signal);
  } catch (error) {
    throw _rejection(error);
  } finally {
    trace.queueWaitMs += performance.now() - queued;
  }
}

/** The answer to a wait that ended without a slot. */
function _rejection(error: unknown): Rejection {
  if (error instanceof RouterStopping) return routerRejections.stopping();
  const kind = (error as { kind?: string } | undefined)?.kind;
  if (kind === "router_busy") return routerRejections.queueFull();
  if (kind === "no_node") return routerRejections.noNode();
  return routerRejections.clientGone(); // the request's signal
}
