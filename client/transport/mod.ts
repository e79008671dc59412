/**
 * How the client's requests travel: the {@linkcode Transport} interface, its two
 * implementations (`fetch`, and the client's own HTTP/1.1 for plain `http://` servers reached
 * without a proxy), the choice between them, and Basic authentication from URL credentials.
 * Internal to the client (not exported by the package).
 *
 * @example
 * ```ts
 * import { openTransport } from "./mod.ts";
 *
 * const transport = openTransport(new URL("http://127.0.0.1:8000"), {
 *   kind: "auto",
 *   connectTimeoutMs: 10_000,
 * });
 * transport.close();
 * ```
 *
 * @module
 */

export * from "./transport.ts";
export * from "./basic_auth.ts";
export * from "./open.ts";
export * from "./fetch.ts";
export * from "./http1.ts";
export type { ConnectTarget, Endpoint } from "./connect.ts";
export type { Http1Target } from "./http1_agent.ts";
