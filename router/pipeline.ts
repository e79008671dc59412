/**
 * `POST /execute` at the Router (spec router §2.2) as a pipeline of named stages, one attempt
 * from the client's request to the node's answer through a slot:
 *
 * ```
 *   Request ─▶ intake     node asked for, length, a small body (400, 413, 408)  router/intake.ts
 *           ─▶ admission  a slot, at once or queued (503, Retry-After: 1)     router/admission.ts
 *           ─▶ exchange   head, body frames, the node's answer (502)          router/exchange.ts
 *           ─▶ finish     the request_finished line; ERROR answers            router/finish.ts
 * ```
 *
 * Every stage turns a request away by throwing a `Rejection` (http/rejection.ts) made by
 * `routerRejections`, which only {@linkcode forwardExecute} turns into the answer. Nothing is
 * ever replayed: once anything of the request has gone to a node, a failure is a 502; a slot that
 * goes away before (a body read whole at intake) hands the request to another slot.
 *
 * @module
 */
import { Rejection } from "../http/rejection.ts";
import { admitRequest } from "./admission.ts";
import type { SlotLease } from "./connections.ts";
import { exchangeOnSlot } from "./exchange.ts";
import { RequestTrace, routerRejections } from "./finish.ts";
import type { ForwardContext } from "./forward_context.ts";
import { receiveRequest } from "./intake.ts";
import type { RouterSlot } from "./slot_link.ts";

export type { ForwardContext } from "./forward_context.ts";

/** Slots a request may take in turn when each goes away before anything was sent on it. */
const _UNSENT_ATTEMPTS = 3;

/** Forwards one `POST /execute` through a node's slot and returns the answer to stream back. */
export async function forwardExecute(request: Request, ctx: ForwardContext): Promise<Response> {
  const trace = new RequestTrace(ctx.events, ctx.onFinished);
  let lease: SlotLease | null = null;
  try {
    const routed = await receiveRequest(request, ctx);
    for (let attempt = 1;; attempt++) {
      lease = await admitRequest(routed, trace, ctx);
      trace.node = lease.nodeId;
      const answer = await exchangeOnSlot(routed, lease, trace, ctx);
      if (answer) return answer;
      lease = null;
      if (attempt === _UNSENT_ATTEMPTS) throw routerRejections.transport();
    }
  } catch (error) {
    if (error instanceof Rejection) return trace.rejected(error);
    (lease?.slot as RouterSlot | undefined)?.close("cancelled", "request_rejected");
    lease?.release(false);
    throw error;
  }
}
