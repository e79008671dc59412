/**
 * ERROR bodies and fixed messages of non-200 responses (spec protocol §3.5), and an error said as
 * text.
 *
 * @module
 */

/** `error.kind` of an ERROR body (server kinds, then router kinds). */
export type ErrorKind =
  | "parse"
  | "request_too_large"
  | "busy"
  | "timeout"
  | "engine"
  | "response_too_large"
  | "invalid_request"
  | "router_busy"
  | "no_node"
  | "server_transport";

/** The fixed messages of ERROR bodies (400 messages are the validator's text). */
export const ERROR_MESSAGES: {
  readonly requestTooLarge: "request exceeds the configured size limit";
  readonly busy: "server saturated";
  readonly timeout: "execution timed out";
  readonly initTimeout: "worker initialization exceeded the execution timeout";
  readonly workerCrashed: "worker crashed";
  readonly invalidWorkerResponse: "invalid worker response";
  readonly cleanupUnconfirmed: "worker cleanup was not confirmed; affected devices unavailable";
  readonly internal: "internal server error";
  readonly responseTooLarge: "results exceed the configured response-size limit";
} = Object.freeze(
  {
    requestTooLarge: "request exceeds the configured size limit",
    busy: "server saturated",
    timeout: "execution timed out",
    initTimeout: "worker initialization exceeded the execution timeout",
    workerCrashed: "worker crashed",
    invalidWorkerResponse: "invalid worker response",
    cleanupUnconfirmed: "worker cleanup was not confirmed; affected devices unavailable",
    internal: "internal server error",
    responseTooLarge: "results exceed the configured response-size limit",
  } as const,
);

/**
 * The compact JSON body of a non-200 response:
 * `{"status":"ERROR","request_id":…,"error":{"kind":…,"message":…}}`.
 */
export function errorBody(requestId: string, kind: string, message: string): string {
  return `{"status":"ERROR","request_id":${JSON.stringify(requestId)},"error":{"kind":${
    JSON.stringify(kind)
  },"message":${JSON.stringify(message)}}}`;
}

/** What `error` says: an `Error`'s message, anything else as a string. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
