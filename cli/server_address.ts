/**
 * Which server a client command talks to, and how: the `--url` / `--host` / `--port` options
 * (selected as `kcoral run` selects its server, except that with nothing given the local
 * default server is asked), the client token (`--token`, `KCORAL_TOKEN`) and a private CA
 * (`--ca-file`, `KCORAL_CA_FILE`). Shared by `kcoral health` and `kcoral mcp`.
 *
 * @example
 * ```ts
 * import { resolveServerAddress } from "./server_address.ts";
 *
 * const address = resolveServerAddress({}, {}, {}, "kcoral health");
 * if (address.url !== "http://127.0.0.1:8000" || address.token !== null) throw new Error();
 * ```
 *
 * @module
 */
import { CommandLineError, type OptionSource } from "../options/command.ts";
import type { OptionTable, OptionTableValues } from "../options/spec.ts";
import { readCaFile } from "../http/access_options.ts";
import { DEFAULT_HOST, DEFAULT_PORT, resolveConnection } from "./run/connection.ts";
import { checkServerUrl } from "./voice.ts";

/** The options that name the server and how to reach it (entries of an options table). */
export const serverAddressOptions = {
  url: {
    flag: "--url",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "url",
    help: `server or Router URL (default $KCORAL_URL, else http://${DEFAULT_HOST}:${DEFAULT_PORT})`,
  },
  host: {
    flag: "--host",
    type: "string",
    default: DEFAULT_HOST,
    placeholder: "host",
    help: "server host, instead of --url",
  },
  port: {
    flag: "--port",
    type: "int",
    default: DEFAULT_PORT,
    placeholder: "port",
    help: "server port, instead of --url",
  },
  token: {
    flag: "--token",
    env: "KCORAL_TOKEN",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "token",
    help: "client token, sent as 'Authorization: Bearer TOKEN' (prefer the variable)",
  },
  caFile: {
    flag: "--ca-file",
    env: "KCORAL_CA_FILE",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "path",
    help: "trust this PEM CA certificate for https:// URLs (self-signed deployments)",
  },
} as const satisfies OptionTable;

type _Values = Partial<OptionTableValues<typeof serverAddressOptions>>;

/** The server to talk to and how. */
export interface ServerAddress {
  /** Its URL, without a trailing slash. */
  url: string;
  /** A warning to print (`--host`/`--port` overriding `KCORAL_URL`). */
  warning?: string;
  /** The client token, or `null`. */
  token: string | null;
  /** Extra trusted CA certificates (PEM). */
  caCerts: string[];
}

/**
 * The address the parsed `values` (and where each came from, `sources`) select; throws
 * {@linkcode CommandLineError} under `command`'s name: exit status 2 for a conflicting
 * selection, 1 for an unreadable CA file.
 */
export function resolveServerAddress(
  values: _Values,
  sources: Partial<Record<keyof _Values, OptionSource>>,
  env: Record<string, string | undefined>,
  command: string,
): ServerAddress {
  const given = {
    url: values.url ?? undefined,
    host: sources.host === "flag" ? values.host : undefined,
    port: sources.port === "flag" && values.port !== undefined ? BigInt(values.port) : undefined,
  };
  const fallback = env.KCORAL_URL || `http://${DEFAULT_HOST}:${DEFAULT_PORT}`;
  const malformed = checkServerUrl(fallback, "KCORAL_URL");
  const connection = Object.values(given).some((value) => value !== undefined)
    ? resolveConnection(given, env.KCORAL_URL)
    : malformed === null
    ? { url: fallback }
    : { error: malformed };
  if ("error" in connection) {
    throw new CommandLineError(`${command}: error: ${connection.error}`, 2);
  }
  let caCerts: string[] = [];
  try {
    if (values.caFile) caCerts = [readCaFile(values.caFile)];
  } catch (error) {
    throw new CommandLineError(`${command}: ${(error as Error).message}`, 1);
  }
  return {
    url: connection.url.replace(/\/+$/, ""),
    ...(connection.warning ? { warning: connection.warning } : {}),
    token: values.token || null,
    caCerts,
  };
}
