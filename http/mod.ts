/**
 * What a KCoral server and a Router share over HTTP: {@linkcode serve} over any
 * {@linkcode HttpApp}, the route table, request-body intake and its reused buffers (and the
 * {@linkcode IdleRelease} that times giving them back), the typed {@linkcode Rejection} that any
 * stage throws for an ERROR answer, request ids, requests in flight and the drain of a stop,
 * background work, and the event log.
 *
 * @module
 */

export * from "./background.ts";
export * from "./body_buffers.ts";
export * from "./events.ts";
export * from "./idle_release.ts";
export * from "./in_flight.ts";
export * from "./rejection.ts";
export * from "./request_body.ts";
export * from "./request_id.ts";
export * from "./routes.ts";
export * from "./serve.ts";
