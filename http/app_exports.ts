/**
 * What the server's and the Router's library entry points (server/mod.ts, router/mod.ts) both
 * export: {@linkcode serve} and its options, the client tokens, the event log's types and the
 * health body's.
 *
 * @module
 */

export {
  type ConnectionLimits,
  type HttpApp,
  type RunningServer,
  serve,
  type ServeOptions,
  type TlsFiles,
} from "./serve.ts";
export {
  ClientTokens,
  type ClientTokensOptions,
  type RefusalReason,
  type ReloadResult,
} from "./client_tokens.ts";
export type { EventLevel, EventLog, EventLogOptions, LogFormat } from "./events.ts";
export type { HealthBody, HealthLoad } from "../protocol/health.ts";
