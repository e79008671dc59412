/**
 * Routing as data: a table of paths, methods and handlers shared by the server and the Router, and
 * the small JSON answers routes use. A route with `access: "client"` (or `"health"`) is guarded by
 * the client tokens given to {@linkcode route}; without tokens all are open.
 *
 * @module
 */
import { type ClientTokens, type RefusalReason, unauthorizedResponse } from "./client_tokens.ts";

/** Handles one matched request. */
export type Handler = (
  request: Request,
  info: Deno.ServeHandlerInfo | undefined,
) => Promise<Response> | Response;

/** One route. */
export interface Route {
  /** The exact path (`/health`). */
  path: string;
  /** Methods it answers (`HEAD` is answered where `GET` is). */
  methods: readonly string[];
  /** The handler. */
  handler: Handler;
  /** Only loopback clients see it (others get 404), as upstream's `/internal/worker-status`. */
  loopbackOnly?: boolean;
  /**
   * Who may call it when client tokens are configured: `"client"` needs a token, `"health"` needs
   * one only with `protectHealth`; absent: always open (node links have their own token, the
   * loopback-only routes none).
   */
  access?: "client" | "health";
}

/** How {@linkcode route} guards the routes marked with `access`. */
export interface RouteGuard {
  /** The accepted client tokens; `null`: every route is open. */
  readonly tokens: ClientTokens | null;
  /** Told about each refused request (never given the header itself). */
  onRefused?(refusal: { path: string; method: string; reason: RefusalReason }): void;
}

/**
 * Finds the route of `request` and runs it: 404 `{"detail":"Not Found"}` for an unknown path, 405
 * with `Allow` for a method the route does not answer (FastAPI's bodies, as upstream), and, with
 * `guard`'s tokens, 401 `unauthorized` for a guarded route without an accepted bearer token
 * (checked before the method, so nothing about a guarded route shows).
 */
export async function route(
  routes: readonly Route[],
  request: Request,
  info: Deno.ServeHandlerInfo | undefined,
  guard?: RouteGuard,
): Promise<Response> {
  const path = new URL(request.url).pathname;
  const match = routes.find((r) => r.path === path && (!r.loopbackOnly || _isLoopback(info)));
  if (!match) return jsonResponse(404, '{"detail":"Not Found"}');
  const tokens = guard?.tokens;
  if (
    tokens && (match.access === "client" || (match.access === "health" && tokens.protectHealth))
  ) {
    const reason = tokens.check(request);
    if (reason !== null) {
      guard!.onRefused?.({ path, method: request.method, reason });
      // The body of a refused upload is not read.
      await request.body?.cancel().catch(() => {});
      return unauthorizedResponse(reason, crypto.randomUUID());
    }
  }
  const method = request.method === "HEAD" && match.methods.includes("GET")
    ? "GET"
    : request.method;
  if (!match.methods.includes(method)) {
    return new Response('{"detail":"Method Not Allowed"}', {
      status: 405,
      headers: { "content-type": "application/json", allow: match.methods.join(", ") },
    });
  }
  return await match.handler(request, info);
}

/** A JSON response (`X-Request-ID` when a request id is given). */
export function jsonResponse(status: number, body: string, requestId?: string): Response {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (requestId) headers["x-request-id"] = requestId;
  return new Response(body, { status, headers });
}

/** Whether the client is on this machine (`127.0.0.0/8`, `::1`, `::ffff:127.0.0.1`). */
function _isLoopback(info: Deno.ServeHandlerInfo | undefined): boolean {
  const addr = info?.remoteAddr as Deno.NetAddr | undefined;
  if (!addr || !("hostname" in addr)) return false;
  return addr.hostname === "::1" || addr.hostname.startsWith("127.") ||
    addr.hostname === "::ffff:127.0.0.1";
}

/** The client's host (as upstream logs `request.client.host`, without the port), or `null`. */
export function peerHost(info: Deno.ServeHandlerInfo | undefined): string | null {
  const addr = info?.remoteAddr as Deno.NetAddr | undefined;
  return addr && "hostname" in addr ? addr.hostname : null;
}
