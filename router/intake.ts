/**
 * Intake, the first stage of a routed `POST /execute` (spec router §2.2): what the Router takes
 * from a client's request before a slot — the node it asks for (`x-kcoral-node`), its declared
 * length (400 when it is not one, 413 past `--max-request-bytes`) and, when the body fits one
 * frame, the body itself (400 when it fails or is not the declared length, 408 when it stalls),
 * which then goes to the node in one frame with its head and end. A body read here never holds a
 * slot while it arrives, and it can still go to another slot if the one taken goes away before
 * anything was sent on it. A larger body is streamed once a slot is taken (router/upload.ts).
 *
 * @module
 */
import { isValidNodeId, MAX_DATA_BYTES, NODE_HEADER } from "../link/messages.ts";
import { declaredLength } from "../http/request_body.ts";
import type { Rejection } from "../http/rejection.ts";
import type { ForwardContext } from "./forward_context.ts";
import { routerRejections } from "./finish.ts";

/** A client's request as the later stages see it. */
export interface RoutedRequest {
  /** The client's request. */
  readonly request: Request;
  /** The client connection's port (how `ClientWatch` finds it), `null` when unknown. */
  readonly clientPort: number | null;
  /** The node asked for (`x-kcoral-node`), `null` when none or not a node id. */
  readonly preferred: string | null;
  /** The declared body length, `null` without a `Content-Length`. */
  readonly length: number | null;
  /** The whole body read here (at most one frame's bytes), `null` when it is streamed later. */
  readonly body: Uint8Array | null;
}

/**
 * Reads what the Router needs of `request` before it takes a slot; throws the
 * {@linkcode Rejection} to answer.
 *
 * @example
 * ```ts
 * import { receiveRequest } from "./intake.ts";
 *
 * const routed = await receiveRequest(
 *   new Request("http://router/execute", {
 *     method: "POST", body: "{}", headers: { "x-kcoral-node": "gpu-a", "content-length": "2" },
 *   }),
 *   null,
 *   { maxRequestBytes: 1 << 20 },
 * );
 * if (routed.preferred !== "gpu-a" || routed.body?.length !== 2) throw new Error("read whole");
 * ```
 */
export async function receiveRequest(
  request: Request,
  clientPort: number | null,
  ctx: Pick<ForwardContext, "maxRequestBytes" | "bodyWatch">,
): Promise<RoutedRequest> {
  const preferredHeader = request.headers.get(NODE_HEADER);
  const preferred = isValidNodeId(preferredHeader) ? preferredHeader : null;
  const length = declaredLength(request.headers);
  if (Number.isNaN(length)) throw routerRejections.invalidLength();
  if (length !== null && length > ctx.maxRequestBytes) throw routerRejections.tooLarge();
  let body: Uint8Array | null = null;
  if (length !== null ? length <= MAX_DATA_BYTES : !request.body) {
    const small = await _smallBodyInTime(request, length, ctx.bodyWatch);
    if (!(small instanceof Uint8Array)) throw small;
    body = small;
  }
  return { request, clientPort, preferred, length, body };
}

/**
 * The whole body of a request that declared at most one frame's bytes (or has none): its bytes, or
 * the rejection to answer (the body failed, or it is not the declared length).
 */
async function _smallBody(
  request: Request,
  length: number | null,
): Promise<Uint8Array | Rejection> {
  const bytes = await _readBody(request);
  if (!(bytes instanceof Uint8Array)) return bytes;
  if (length !== null && bytes.length !== length) return routerRejections.lengthMismatch();
  return bytes;
}

/**
 * {@linkcode _smallBody} under the body timeout: a body not whole by then is answered 408 (what
 * still arrives is read by `Deno.serve` and dropped).
 */
async function _smallBodyInTime(
  request: Request,
  length: number | null,
  watch: ForwardContext["bodyWatch"],
): Promise<Uint8Array | Rejection> {
  if (!request.body || !watch) return await _smallBody(request, length);
  const { promise: stalled, resolve } = Promise.withResolvers<Rejection>();
  const read = watch.watch(() => resolve(routerRejections.bodyTimeout(watch.timeoutMs)));
  try {
    return await Promise.race([_smallBody(request, length), stalled]);
  } finally {
    read.done();
  }
}

/**
 * The client's whole body (empty when it has none), or the rejection its failure is answered
 * with; a promise chain rather than an `async` function, one layer less on every small request.
 */
function _readBody(request: Request): Promise<Uint8Array | Rejection> {
  return request.body
    ? request.bytes().catch(routerRejections.bodyFailed)
    : Promise.resolve(new Uint8Array(0));
}
