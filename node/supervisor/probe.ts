/**
 * The supervisor's local health probe (spec router §5.2): `GET {server}/internal/worker-status`
 * on the node's own KCoral server, the whole exchange (connect included) bounded by the health
 * timeout, with no redirects and no proxy.
 *
 * The endpoint answers loopback peers only (others get 404), so the probe origin is derived
 * from the server's `--host`/`--port` with {@linkcode probeOrigin} (a host name resolved first
 * by {@linkcode resolveProbeHost}; a wildcard bind is probed on loopback), and a server bound to one specific non-loopback address is probed *from*
 * loopback (the connection's source address is bound to `127.0.0.1` or `::1`; Linux routes
 * that to any local address). Proxy variables (`HTTP_PROXY`, ...) never apply: the probe's
 * HTTP client sends every request straight to the server's address.
 *
 * @module
 */
import { lookup } from "node:dns/promises";

/** What a successful probe reports about the server (spec router §5.2). */
export interface ServerHealth {
  /** The server's `instance_id` (new on every server start). */
  instanceId: string;
  /** The server's workers (> 0). */
  workerCount: number;
  /** Of which busy (≤ `workerCount`). */
  busyWorkers: number;
  /** The server's compilation target. */
  target: Record<string, string>;
  /** The server's runtime versions. */
  versions: Record<string, string>;
}

/** The outcome of one probe: the health, or why the server is not healthy. */
export type ProbeResult =
  | { readonly ok: true; readonly health: ServerHealth }
  | { readonly ok: false; readonly error: string };

/** The path the probe asks. */
export const WORKER_STATUS_PATH = "/internal/worker-status";

const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/**
 * The address to probe a server bound to `host` at: an IP literal or a wildcard as it is, a name
 * resolved by the system's resolver (its first address, as `getaddrinfo` gives them: the hosts
 * file, then DNS; spec cli §1.4, "The probe IP is the first getaddrinfo result for --host").
 * An address keeps the probe on an address the server listens on and lets it connect from
 * loopback. Rejects when the name does not resolve.
 */
export async function resolveProbeHost(host: string): Promise<string> {
  const name = host.trim();
  if (name === "" || IPV4.test(name) || name.includes(":")) return host;
  return (await lookup(name)).address;
}

/**
 * The origin (`http://host:port/`) to probe a server bound to `host`:`port`: a wildcard bind
 * (`0.0.0.0`, `::`, empty) is probed on the loopback address of its family, and an IPv6
 * address is written in brackets.
 */
export function probeOrigin(host: string, port: number): string {
  let name = host.trim();
  if (name.startsWith("[") && name.endsWith("]")) name = name.slice(1, -1);
  if (name === "" || name === "0.0.0.0") name = "127.0.0.1";
  else if (name === "::" || name === "::0" || /^(0{1,4}:){7}0{1,4}$/.test(name)) name = "::1";
  return `http://${name.includes(":") ? `[${name}]` : name}:${port}/`;
}

/**
 * Checks a `/internal/worker-status` body: a JSON object with `status` `"ok"`, a non-empty
 * string `instance_id`, an integer `worker_count` > 0, an integer `busy_workers` between 0 and
 * `worker_count`, and `target` and `versions` maps of strings to strings. Returns the health,
 * or what is wrong as a string.
 */
export function parseWorkerStatus(body: unknown): ServerHealth | string {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return "worker status is not a JSON object";
  }
  const b = body as Record<string, unknown>;
  if (b.status !== "ok") return `worker status is ${JSON.stringify(b.status ?? null)}, not "ok"`;
  if (typeof b.instance_id !== "string" || b.instance_id === "") {
    return "worker status has no instance_id";
  }
  if (!Number.isSafeInteger(b.worker_count) || (b.worker_count as number) <= 0) {
    return `worker_count ${JSON.stringify(b.worker_count ?? null)} is not a positive integer`;
  }
  const workers = b.worker_count as number;
  if (
    !Number.isSafeInteger(b.busy_workers) || (b.busy_workers as number) < 0 ||
    (b.busy_workers as number) > workers
  ) {
    return `busy_workers ${
      JSON.stringify(b.busy_workers ?? null)
    } is not an integer between 0 and worker_count ${workers}`;
  }
  if (!isStringMap(b.target)) return "worker status target is not a map of strings";
  if (!isStringMap(b.versions)) return "worker status versions is not a map of strings";
  return {
    instanceId: b.instance_id,
    workerCount: workers,
    busyWorkers: b.busy_workers as number,
    target: { ...b.target },
    versions: { ...b.versions },
  };
}

/**
 * Probes the server at `serverUrl` (an origin from {@linkcode probeOrigin}) once. The request
 * (connect, headers and body) is given `timeoutMs`; `signal` abandons it early. Never throws:
 * failures come back as `{ ok: false, error }`.
 */
export async function probeServer(
  serverUrl: string,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<ProbeResult> {
  let url: URL;
  try {
    url = new URL(WORKER_STATUS_PATH, serverUrl);
  } catch {
    return { ok: false, error: `invalid server URL ${serverUrl}` };
  }
  const hostname = url.hostname;
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  let client: Deno.HttpClient;
  try {
    client = Deno.createHttpClient({
      // Every request goes straight to the server: no HTTP_PROXY, no NO_PROXY rules.
      proxy: { transport: "tcp", hostname, port },
      localAddress: loopbackSource(hostname),
      poolMaxIdlePerHost: 0,
    });
  } catch (error) {
    return { ok: false, error: `cannot create the probe client: ${describe(error)}` };
  }
  const timeout = AbortSignal.timeout(timeoutMs);
  const abort = signal ? AbortSignal.any([timeout, signal]) : timeout;
  try {
    const response = await fetch(url, { client, redirect: "manual", signal: abort });
    const text = await response.text();
    if (response.status < 200 || response.status > 299) {
      return { ok: false, error: `worker status answered HTTP ${response.status}` };
    }
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      return { ok: false, error: "worker status is not JSON" };
    }
    const health = parseWorkerStatus(body);
    return typeof health === "string" ? { ok: false, error: health } : { ok: true, health };
  } catch (error) {
    if (timeout.aborted) {
      return { ok: false, error: `health probe timed out after ${timeoutMs} ms` };
    }
    if (signal?.aborted) return { ok: false, error: "health probe abandoned" };
    return { ok: false, error: `health probe failed: ${describe(error)}` };
  } finally {
    client.close();
  }
}

/** The loopback address to connect from when `hostname` is a non-loopback IP literal. */
function loopbackSource(hostname: string): string | undefined {
  if (IPV4.test(hostname)) return hostname.startsWith("127.") ? undefined : "127.0.0.1";
  if (hostname.startsWith("[")) {
    const ip = hostname.slice(1, -1);
    return ip === "::1" || ip.startsWith("::ffff:127.") ? undefined : "::1";
  }
  return undefined;
}

function isStringMap(value: unknown): value is Record<string, string> {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    Object.values(value).every((v) => typeof v === "string");
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.message}${cause}`;
}
