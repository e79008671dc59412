/**
 * `kcoral health`: asks a KCoral server or Router for `GET /health` and prints it readably (or
 * as JSON with `--json`, for scripts). Exit status 0 when it answers `ok`, 1 when it is
 * unavailable or cannot be reached, 2 for a malformed command line.
 *
 * ```
 *  --url / --host --port / KCORAL_URL / http://127.0.0.1:8000 ─▶ GET /health (timeout)
 *    ─▶ 200 or 503 with a health body ─▶ text (or --json) ─▶ exit 0 / 1
 *    ─▶ anything else ─▶ "kcoral health: cannot reach URL: why" ─▶ exit 1
 * ```
 *
 * @module
 */
import {
  CommandLineError,
  type CommandLineSpec,
  commandLineUsage,
  parseCommandLine,
} from "../options/command.ts";
import { grantedEnv } from "../options/defaults.ts";
import type { OptionTable } from "../options/spec.ts";
import { versionLine } from "../options/version.ts";
import type { HealthBody, RouterHealthBody } from "../protocol/health.ts";
import { resolveServerAddress, serverAddressOptions } from "./server_address.ts";
import { describeTlsFailure } from "../protocol/tls_failure.ts";
import { failureLines } from "./voice.ts";

/** The options of `kcoral health`. */
export const healthOptions = {
  url: serverAddressOptions.url,
  host: serverAddressOptions.host,
  port: serverAddressOptions.port,
  timeoutSeconds: {
    flag: "--timeout",
    type: "number",
    min: 0.001,
    default: 10,
    placeholder: "s",
    help: "how long to wait for the answer",
  },
  token: serverAddressOptions.token,
  caFile: serverAddressOptions.caFile,
  json: {
    flag: "--json",
    type: "boolean",
    default: false,
    help: "print the /health body as JSON",
  },
} as const satisfies OptionTable;

const _COMMAND: CommandLineSpec = {
  name: "kcoral health",
  description: "Show whether a KCoral server or Router is up: status, target, versions and load.",
  epilog: "Exit status 0 when it answers ok, 1 when it is unavailable or unreachable, 2 for " +
    "a malformed command line (a --url that is not http:// or https:// included).",
  examples: [
    "kcoral health --url http://gpu-box:8000",
    "KCORAL_URL=https://kcoral.example KCORAL_TOKEN=... kcoral health --json",
  ],
  version: versionLine(),
};

/** A `/health` answer: the HTTP status and the body. */
export interface HealthAnswer {
  /** The URL asked. */
  url: string;
  /** 200 (ok) or 503 (a Router with no ready node). */
  httpStatus: number;
  /** The body. */
  body: HealthBody | RouterHealthBody;
}

/**
 * The readable form of a `/health` answer.
 *
 * @example
 * ```ts
 * import { formatHealth } from "./health.ts";
 *
 * const text = formatHealth({
 *   url: "http://127.0.0.1:8000", httpStatus: 200,
 *   body: {
 *     status: "ok", instance_id: "7d4c…", started_at: "2026-12-02T08:00:00.000000Z", gpu_count: 1,
 *     load: { request_capacity: 8, requests_in_progress: 2, requests_waiting: 0 },
 *     target: { arch: "sm_90a" }, versions: { python: "3.11.2", torch: "2.11.0" },
 *   },
 * });
 * if (!text.startsWith("http://127.0.0.1:8000: ok (server)")) throw new Error(text);
 * if (!text.includes("load      2 of 8 busy, 0 waiting")) throw new Error(text);
 * if (!text.includes("target    arch=sm_90a")) throw new Error(text);
 * ```
 */
export function formatHealth(answer: HealthAnswer): string {
  const body = answer.body;
  const router = body.gpu_count === null;
  const pairs = (record: Record<string, string>, sep: string) => {
    const entries = Object.entries(record);
    return entries.length === 0 ? "-" : entries.map(([k, v]) => `${k}${sep}${v}`).join(", ");
  };
  const load = body.load;
  const noTarget = router ? "- (no node has joined)" : "- (a CPU server)";
  const lines = [
    `${answer.url}: ${body.status} (${router ? "Router" : "server"})`,
    `  load      ${load.requests_in_progress} of ${load.request_capacity} busy, ${load.requests_waiting} waiting`,
    `  target    ${Object.keys(body.target).length > 0 ? pairs(body.target, "=") : noTarget}`,
    `  versions  ${pairs(body.versions, " ")}`,
  ];
  if (!router) lines.push(`  GPUs      ${body.gpu_count}`);
  lines.push(`  instance  ${body.instance_id}, started ${body.started_at}`);
  return lines.join("\n");
}

/** The innermost message of an error: Deno's fetch says "fetch failed" and puts why in `cause`. */
function _reason(error: unknown): string {
  let reason = error;
  while (reason instanceof Error && reason.cause instanceof Error) reason = reason.cause;
  return reason instanceof Error ? reason.message : String(reason);
}

/**
 * fetch's words for a refused connection (`tcp connect error: Connection refused (os error
 * 111)`) in the words the client's own transport uses, so `health` and `run` say it alike.
 */
function _connectReason(target: string, reason: string): string {
  const refused = /tcp connect error: (.*)$/.exec(reason);
  if (!refused) return reason;
  const url = new URL(target);
  const port = url.port || (url.protocol === "https:" ? "443" : "80");
  return `cannot connect to ${url.hostname.replace(/^\[(.*)\]$/, "$1")}:${port}: ${refused[1]}`;
}

function _isHealthBody(value: unknown): value is HealthBody | RouterHealthBody {
  const body = value as Record<string, unknown> | null;
  const load = body?.load as Record<string, unknown> | undefined;
  return typeof body === "object" && body !== null && typeof body.status === "string" &&
    typeof load === "object" && load !== null && typeof load.request_capacity === "number" &&
    typeof body.target === "object" && typeof body.versions === "object";
}

/** What {@linkcode fetchHealth} sends besides the request: a token, trusted CAs. */
export interface HealthAccess {
  /** A client token (`--token`, `KCORAL_TOKEN`). */
  token?: string | null;
  /** Extra trusted CA certificates (PEM), for `https://` (`--ca-file`, `KCORAL_CA_FILE`). */
  caCerts?: readonly string[];
}

/**
 * Asks `url` for `/health`; throws an `Error` that names the URL and the reason when there is
 * no health answer (nothing listening, a timeout, not a KCoral server).
 *
 * @example
 * ```ts
 * import { fetchHealth } from "./health.ts";
 *
 * const failed = await fetchHealth("http://127.0.0.1:1", 1000).then(() => "", (e) => e.message);
 * if (!failed.startsWith("cannot reach http://127.0.0.1:1/health")) throw new Error(failed);
 * ```
 */
export async function fetchHealth(
  url: string,
  timeoutMs: number,
  access: HealthAccess = {},
): Promise<HealthAnswer> {
  const target = `${url.replace(/\/+$/, "")}/health`;
  let response: Response;
  const headers: Record<string, string> = {};
  if (access.token) headers.authorization = `Bearer ${access.token}`;
  const client = Deno.createHttpClient({ caCerts: [...(access.caCerts ?? [])] });
  let text: string;
  try {
    try {
      response = await fetch(target, { headers, client, signal: AbortSignal.timeout(timeoutMs) });
    } catch (error) {
      const why = error instanceof DOMException && error.name === "TimeoutError"
        ? `no answer within ${timeoutMs / 1000} s`
        : describeTlsFailure(error) ?? _connectReason(target, _reason(error));
      throw new Error(`cannot reach ${target}: ${why}`, { cause: error });
    }
    text = await response.text();
  } finally {
    client.close();
  }
  if (response.status === 401) {
    let message = text.slice(0, 200);
    try {
      message = JSON.parse(text).error.message ?? message;
    } catch {
      // not an ERROR body: the text as it is
    }
    throw new Error(
      `${target} refused the request (HTTP 401: ${message}); ` +
        (access.token ? "the token given is not accepted" : "give a client token") +
        " (--token or KCORAL_TOKEN)",
    );
  }
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  if ((response.status !== 200 && response.status !== 503) || !_isHealthBody(body)) {
    throw new Error(
      `${target} answered HTTP ${response.status} without a KCoral health body: ${
        text.slice(0, 120)
      }`,
    );
  }
  return { url: url.replace(/\/+$/, ""), httpStatus: response.status, body };
}

/**
 * Runs `kcoral health ARGS`; resolves with the exit status.
 *
 * @example
 * ```ts
 * import { healthMain } from "./health.ts";
 *
 * // Nothing listens on port 1: exit status 1, and the error names the URL.
 * if (await healthMain(["--url", "http://127.0.0.1:1", "--timeout", "1"], {}) !== 1) {
 *   throw new Error();
 * }
 * ```
 */
export async function healthMain(
  argv: string[],
  env: Record<string, string | undefined> = grantedEnv(),
): Promise<number> {
  let url: string;
  let json: boolean;
  let timeoutMs: number;
  let access: HealthAccess;
  try {
    const parsed = parseCommandLine(argv, healthOptions, _COMMAND, env);
    if (parsed.kind === "help") {
      console.log(parsed.text.trimEnd());
      return 0;
    }
    const v = parsed.values;
    const address = resolveServerAddress(v, parsed.sources, env, "kcoral health");
    if (address.warning) console.error(address.warning);
    url = address.url;
    json = v.json ?? false;
    timeoutMs = (v.timeoutSeconds ?? 10) * 1000;
    access = { token: address.token, caCerts: address.caCerts };
  } catch (error) {
    if (!(error instanceof CommandLineError)) throw error;
    if (error.exitCode === 2) console.error(commandLineUsage(healthOptions, _COMMAND).trimEnd());
    console.error(error.message);
    return error.exitCode;
  }
  let answer: HealthAnswer;
  try {
    answer = await fetchHealth(url, timeoutMs, access);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    Deno.stderr.writeSync(
      new TextEncoder().encode(failureLines("kcoral health", message, error, url)),
    );
    return 1;
  }
  console.log(json ? JSON.stringify(answer.body, null, 2) : formatHealth(answer));
  return answer.httpStatus === 200 && answer.body.status === "ok" ? 0 : 1;
}
