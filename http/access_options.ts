/**
 * Who may talk to a server or Router, and over what: the client-token and TLS options shared by
 * `kcoral server` and `kcoral router` (all off by default). They are kept out of the server's and
 * the Router's configurations, so no token reaches the configuration logged at start.
 *
 * @module
 */
import type { OptionTable } from "../options/spec.ts";
import { errorMessage } from "../protocol/errors.ts";
import { ClientTokens, splitTokens } from "./client_tokens.ts";
import type { TlsFiles } from "./serve.ts";

/** An optional file path option's fields. */
const _PATH = {
  type: "string",
  nonEmpty: true,
  nullable: true,
  default: null,
  placeholder: "path",
} as const;

/** The access options of `kcoral server` and `kcoral router`, in `--help` order. */
export const accessOptions = {
  /** Bearer tokens clients must send; comma-separated, repeatable. */
  clientTokens: {
    flag: "--client-token",
    env: "KCORAL_CLIENT_TOKEN",
    type: "list",
    items: { type: "string" },
    default: [],
    placeholder: "token",
    help: "require 'Authorization: Bearer TOKEN' on /execute, /metrics and /status " +
      "(comma-separated; prefer the variable, or --client-token-file, to keep tokens out of " +
      "the process list)",
  },
  /** A file of tokens, one per line (`#` comments), read again on SIGHUP. */
  clientTokenFile: {
    flag: "--client-token-file",
    env: "KCORAL_CLIENT_TOKEN_FILE",
    ..._PATH,
    help: "accepted client tokens, one per line ('#' comments); read again on SIGHUP",
  },
  /** `/health` needs a token too. */
  protectHealth: {
    flag: "--protect-health",
    type: "boolean",
    default: false,
    help: "require a client token on /health too",
  },
  /** The PEM certificate chain to serve HTTPS with. */
  tlsCert: {
    flag: "--tls-cert",
    env: "KCORAL_TLS_CERT",
    ..._PATH,
    help: "serve HTTPS with this PEM certificate chain (with --tls-key)",
  },
  /** The PEM private key of `--tls-cert`. */
  tlsKey: {
    flag: "--tls-key",
    env: "KCORAL_TLS_KEY",
    ..._PATH,
    help: "the PEM private key of --tls-cert",
  },
} as const satisfies OptionTable;

/** The access settings of a server or Router (what {@linkcode accessOptions} sets). */
export interface AccessConfig {
  /** Accepted client tokens given directly (split on commas). */
  clientTokens: string[];
  /** A token file, or `null`. */
  clientTokenFile: string | null;
  /** `/health` needs a token too. */
  protectHealth: boolean;
  /** PEM certificate chain file, or `null` for plain HTTP. */
  tlsCert: string | null;
  /** PEM private key file, or `null`. */
  tlsKey: string | null;
}

/**
 * Completes and checks access settings as a command line gives them (throws a `TypeError` whose
 * message starts with the flag at fault, never quoting a token): tokens split on commas and of RFC
 * 6750's characters, `--tls-cert` and `--tls-key` together, `--protect-health` only with tokens. An
 * empty `KCORAL_CLIENT_TOKEN` (an empty list here) means no token.
 */
export function checkAccessConfig(values: Readonly<Partial<AccessConfig>>): AccessConfig {
  const flat = (values.clientTokens ?? []).filter((value) => value.trim() !== "");
  const config: AccessConfig = {
    clientTokens: splitTokens(flat, accessOptions.clientTokens.flag),
    clientTokenFile: values.clientTokenFile ?? null,
    protectHealth: values.protectHealth ?? false,
    tlsCert: values.tlsCert ?? null,
    tlsKey: values.tlsKey ?? null,
  };
  if (config.tlsCert !== null && config.tlsKey === null) {
    throw new TypeError("--tls-cert requires --tls-key");
  }
  if (config.tlsKey !== null && config.tlsCert === null) {
    throw new TypeError("--tls-key requires --tls-cert");
  }
  if (
    config.protectHealth && config.clientTokens.length === 0 && config.clientTokenFile === null
  ) {
    throw new TypeError("--protect-health requires --client-token or --client-token-file");
  }
  return config;
}

/** What the access settings make: the token set (or `null`) and the TLS files (or `null`). */
export interface Access {
  /** The accepted client tokens; `null`: every route is open. */
  tokens: ClientTokens | null;
  /** The certificate and key read from their files; `null`: plain HTTP. */
  tls: TlsFiles | null;
}

/**
 * Reads what `config` names: the token file and the certificate and key files. Throws an `Error`
 * naming the file that cannot be read or used (never a token).
 */
export function loadAccess(config: AccessConfig): Access {
  const anyToken = config.clientTokens.length > 0 || config.clientTokenFile !== null;
  const tokens = anyToken
    ? new ClientTokens({
      tokens: config.clientTokens,
      file: config.clientTokenFile,
      protectHealth: config.protectHealth,
    })
    : null;
  const tls = config.tlsCert !== null && config.tlsKey !== null
    ? { cert: _readPem(config.tlsCert, "certificate"), key: _readPem(config.tlsKey, "private key") }
    : null;
  return { tokens, tls };
}

function _readPem(path: string, what: string): string {
  const text = _readText(path, `the TLS ${what}`);
  if (!text.includes("-----BEGIN ")) throw new Error(`the TLS ${what} ${path} is not PEM`);
  return text;
}

function _readText(path: string, what: string): string {
  try {
    return Deno.readTextFileSync(path);
  } catch (error) {
    throw new Error(`cannot read ${what} ${path}: ${errorMessage(error)}`);
  }
}

/**
 * The PEM text of a CA file (`--ca-file`, `KCORAL_CA_FILE`); an `Error` naming the file when it
 * cannot be read or holds no PEM certificate.
 */
export function readCaFile(path: string): string {
  const text = _readText(path, "the CA file");
  if (!text.includes("-----BEGIN CERTIFICATE-----")) {
    throw new Error(`the CA file ${path} holds no PEM certificate`);
  }
  return text;
}

/**
 * The warning for a server or Router that listens beyond this machine (`--host` not a loopback name
 * or address) with no client tokens: anyone who reaches the port runs code there. `null` when it
 * listens on loopback or checks tokens.
 */
export function openBindWarning(
  host: string,
  tokens: ClientTokens | null,
  command: string,
): string | null {
  if (tokens !== null) return null;
  const bare = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  if (bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare)) return null;
  return `${command}: warning: listening on ${host} without client tokens: anyone who can reach ` +
    "this port can run programs here; set KCORAL_CLIENT_TOKEN or --client-token-file " +
    "(docs/security.md), or listen on 127.0.0.1";
}
