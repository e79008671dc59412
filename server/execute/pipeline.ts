/**
 * `POST /execute` as a pipeline of stages over a running server's {@linkcode Services}: intake
 * (read the body), admission (parse, blobs, clamps), dispatch (seat, run) and finish (the
 * response and its record). It maps a Web `Request` (or a node link's
 * {@linkcode WholeBodyRequest}) to a `Response`. A program with `X-KCoral-Stream: output` is
 * answered at once with a live-output stream whose final part is what finish makes.
 *
 * @module
 */
import { wantsLiveOutput } from "../../protocol/live_output.ts";
import { keptReturnsMinBytes } from "../../protocol/kept_returns.ts";
import { requestId } from "../../http/request_id.ts";
import { admitRequest } from "./admission.ts";
import { dispatchRequest } from "./dispatch.ts";
import { finishRequest } from "./finish.ts";
import {
  busyRejection,
  discardBody,
  invalidRequest,
  type ReceivedBody,
  type WholeBodyRequest,
} from "./intake.ts";
import { LiveOutput } from "./live_output.ts";
import type { Services } from "../services.ts";

/** Executes one `/execute` request from a client at `client` (its host, for the log). */
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
      throw busyRejection();
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

/** The request's `X-KCoral-Keep-Returns`; a malformed one is a 400 (its body dropped first). */
async function _keepMinBytes(request: Request | WholeBodyRequest): Promise<number | null> {
  try {
    return keptReturnsMinBytes(request.headers);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    await discardBody(request);
    throw invalidRequest(error.message);
  }
}
