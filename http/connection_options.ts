/**
 * The connection options of `kcoral server` and `kcoral router`: the header, idle and body timeouts
 * and the bound on connections of http/http1_server.ts, declared once as an options table, and the
 * {@linkcode ConnectionLimits} they set.
 *
 * @module
 */
import type { OptionTable } from "../options/spec.ts";
import type { ConnectionLimits } from "./http1_connection.ts";

/** The connection options of `kcoral server` and `kcoral router`, in `--help` order. */
export const connectionOptions = {
  /** A request head must arrive whole within this many seconds of its first byte (then 408). */
  headerTimeoutSeconds: {
    flag: "--header-timeout-seconds",
    type: "number",
    above: 0,
    default: 10,
    placeholder: "s",
    help: "a request head must arrive within this (408)",
  },
  /** A connection with no request begun is closed after this many seconds. */
  keepAliveTimeoutSeconds: {
    flag: "--keep-alive-timeout-seconds",
    type: "number",
    above: 0,
    default: 30,
    placeholder: "s",
    help: "close a connection idle this long",
  },
  /** A request body that makes no progress for this many seconds is cut (408). */
  bodyTimeoutSeconds: {
    flag: "--body-timeout-seconds",
    type: "number",
    above: 0,
    default: 30,
    placeholder: "s",
    help: "cut a request body without progress this long (408)",
  },
  /** Connections served at once; beyond, only `GET /health` is answered (others 503). */
  maxConnections: {
    flag: "--max-connections",
    type: "int",
    min: 1,
    default: 1024,
    placeholder: "n",
    help: "open connections; beyond, only /health is answered",
  },
} as const satisfies OptionTable;

/** The settings {@linkcode connectionOptions} set, in seconds. */
export interface ConnectionConfig {
  /** How long a request head may take from its first byte, in seconds. */
  headerTimeoutSeconds: number;
  /** How long a connection may stay open with no request begun, in seconds. */
  keepAliveTimeoutSeconds: number;
  /** How long a request body may make no progress before it is cut, in seconds. */
  bodyTimeoutSeconds: number;
  /** Client connections served at once. */
  maxConnections: number;
}

/**
 * The limits a server's or Router's connections are served under (http/http1_server.ts), from its
 * options; `serve`'s `connections`.
 */
export function connectionLimits(config: ConnectionConfig): ConnectionLimits {
  return {
    headerTimeoutMs: config.headerTimeoutSeconds * 1000,
    keepAliveTimeoutMs: config.keepAliveTimeoutSeconds * 1000,
    bodyTimeoutMs: config.bodyTimeoutSeconds * 1000,
    maxConnections: config.maxConnections,
  };
}
