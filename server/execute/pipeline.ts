/**
 * `POST /execute` as a pipeline of named stages over a running server's {@linkcode Services}:
 *
 * ```
 *   Request ─▶ intake      read the body (413, 400, 503)                     intake.ts
 *           ─▶ admission   parse, blobs and CACHE_MISS, clamps (400)          admission.ts
 *           ─▶ dispatch    seat, GPU set, run, attribution (503, 504, 500)    dispatch.ts
 *           ─▶ finish      the response and its request_finished record       finish.ts
 * ```
 *
 * It takes a Web `Request` and gives a Web `Response`, so `Deno.serve` is only one way to drive
 * it: a node linked to a Router feeds it the requests it tunnels, a small body as a
 * {@linkcode WholeBodyRequest} (its bytes, no `Request` or stream).
 *
 * A request with `X-KCoral-Stream: output` that is admitted as a program is answered at once
 * with a live-output stream (server/execute/live_output.ts): dispatch and finish then run behind
 * it, and the answer finish makes becomes the stream's final part. One with
 * `X-KCoral-Keep-Returns: <n>` has its large returns kept in the blob cache rather than sent
 * (protocol/kept_returns.ts; dispatch passes the request on, result_body caches them).
 *
 * @module
 */
import { ERROR_MESSAGES } from "../../protocol/errors.ts";
import { wantsLiveOutput } from "../../protocol/live_output.ts";
import { keptReturnsMinBytes } from "../../protocol/kept_returns.ts";
import { Rejection } from "../../http/rejection.ts";
import { requestId } from "../../http/request_id.ts";
import { admitRequest } from "./admission.ts";
import { dispatchRequest } from "./dispatch.ts";
import { finishRequest } from "./finish.ts";
import { discardBody, invalidRequest, type ReceivedBody, type WholeBodyRequest } from "./intake.ts";
import { LiveOutput } from "./live_output.ts";
import type { Services } from "../services.ts";

/**
 * Executes one `/execute` request from a client at `client` (its host, for the log).
 *
 * Exercised through HTTP by the server tests, and without `Deno.serve` by
 * tests/server_pipeline_test.ts.
 */
export async function executeRequest(
  services: Services,
  request: Request | WholeBodyRequest,
  client: string | null,
): Promise<Response> {
  const id = requestId(request.headers);
  services.events.emit("INFO", "request_received", {
    request_id: id,
    client,
    content_length: request.headers.get("content-length"),
  });
  services.inFlight.enter();
  let received: ReceivedBody | null = null;
  let handedOff = false;
  try {
    if (services.inFlight.closing) {
      await discardBody(request);
      throw new Rejection(503, "busy", ERROR_MESSAGES.busy, "no_worker", { queue_ms: 0 });
    }
    const keepMinBytes = await _keepMinBytes(request);
    received = await services.intake.receive(request);
    const admitted = await admitRequest(
      services,
      received,
      request.headers.get("content-type"),
      id,
    );
    if (admitted.kind !== "cache_miss" && keepMinBytes !== null) {
      admitted.keepMinBytes = keepMinBytes;
    }
    if (admitted.kind !== "cache_miss" && wantsLiveOutput(request.headers)) {
      const live = new LiveOutput();
      const body = received;
      const final = dispatchRequest(services, admitted, live, request.signal)
        .then((outcome) => finishRequest(services.events, id, outcome))
        .catch((error) => finishRequest(services.events, id, error))
        .finally(() => {
          body.release();
          services.inFlight.leave();
        });
      handedOff = true;
      return live.response(id, final);
    }
    const outcome = admitted.kind === "cache_miss"
      ? admitted
      : await dispatchRequest(services, admitted, undefined, request.signal);
    return finishRequest(services.events, id, outcome);
  } catch (error) {
    return finishRequest(services.events, id, error);
  } finally {
    if (!handedOff) {
      received?.release();
      services.inFlight.leave();
    }
  }
}

/**
 * The request's `X-KCoral-Keep-Returns` (protocol/kept_returns.ts); a malformed one is a 400
 * (its body read and dropped first, so the connection stays usable).
 */
async function _keepMinBytes(request: Request | WholeBodyRequest): Promise<number | null> {
  try {
    return keptReturnsMinBytes(request.headers);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    await discardBody(request);
    throw invalidRequest(error.message);
  }
}
