/**
 * Server selection for `kcoral run`: `--url`, `--host`/`--port`, or `KCORAL_URL`.
 *
 * @module
 */

import { checkServerUrl } from "../voice.ts";
import { isIPv6Address } from "./ipv6.ts";

/** Default host when only `--port` is given. */
export const DEFAULT_HOST = "127.0.0.1";
/** Default port when only `--host` is given. */
export const DEFAULT_PORT = 8000;

/** Connection options as given on the command line. */
export interface ConnectionOptions {
  /** `--url`, if given. */
  url?: string;
  /** `--host`, if given. */
  host?: string;
  /** `--port`, if given (already an integer). */
  port?: bigint;
}

/** The selected server URL, or the argument error; `warning` is printed either way. */
export type ConnectionResult =
  | { url: string; warning?: string }
  | { error: string; warning?: string };

const _HOST_ERROR = "--host must be a hostname or IP address, without a scheme, port or path";
// Whitespace as Python's regex \s sees it (beyond ASCII), and URL delimiters.
const _FORBIDDEN = new Set([..."\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000/@?#\\"]);

/**
 * Select the server URL.
 *
 * With `--host` or `--port`: `--url` as well is an error; the port must be 1..65535; the
 * host must be a hostname, an IPv4 address, or an IPv6 address with or without brackets
 * (the URL always gets brackets); the URL is `http://HOST:PORT`, nothing is inherited from
 * `KCORAL_URL`, and a warning is returned when a nonempty `KCORAL_URL` is overridden.
 * Otherwise `--url`, then a nonempty `KCORAL_URL`; neither is an error, and so is one that is not
 * an `http://` or `https://` URL (cli/voice.ts `checkServerUrl`, with a suggestion).
 *
 * @example
 * ```ts
 * import { resolveConnection } from "./connection.ts";
 * resolveConnection({ host: "::1", port: 9000n }, undefined); // { url: "http://[::1]:9000" }
 * ```
 */
export function resolveConnection(
  options: ConnectionOptions,
  environmentUrl: string | undefined,
): ConnectionResult {
  if (options.host === undefined && options.port === undefined) {
    const url = options.url ?? environmentUrl;
    if (!url) return { error: "set KCORAL_URL or pass --url, --host or --port" };
    const malformed = checkServerUrl(url, options.url === undefined ? "KCORAL_URL" : "--url");
    return malformed === null ? { url } : { error: malformed };
  }
  if (options.url !== undefined) return { error: "--url cannot be combined with --host or --port" };
  const port = options.port ?? BigInt(DEFAULT_PORT);
  if (port < 1n || port > 65535n) return { error: "--port must be between 1 and 65535" };
  const host = _urlHost(options.host ?? DEFAULT_HOST);
  if (host === undefined) return { error: _HOST_ERROR };
  const url = `http://${host}:${port}`;
  return environmentUrl
    ? { url, warning: `kcoral: warning: --host/--port override KCORAL_URL; using ${url}` }
    : { url };
}

// The host as it appears in the URL, or undefined when it is not acceptable.
function _urlHost(host: string): string | undefined {
  if (host === "" || Array.from(host).some(_isForbidden)) return undefined;
  if (host.includes(":")) {
    const address = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
    return isIPv6Address(address) ? `[${address}]` : undefined;
  }
  return /[[\]%]/.test(host) ? undefined : host;
}

// Control characters and ASCII whitespace (0x00-0x20, 0x7f), U+2000-U+200A, and the rest.
function _isForbidden(char: string): boolean {
  const code = char.codePointAt(0)!;
  return code <= 0x20 || code === 0x7f || (code >= 0x2000 && code <= 0x200a) ||
    _FORBIDDEN.has(char);
}
