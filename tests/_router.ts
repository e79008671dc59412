/**
 * Test helper: a real routed deployment on loopback: `kcoral router` and `kcoral server
 * --router` nodes as processes (each node a supervisor, its server and the server's Python
 * workers), their console lines captured.
 */
import assert from "node:assert/strict";

const CLI = new URL("../cli.ts", import.meta.url).pathname;

/** A free loopback port (bound, read, released). */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** A `kcoral` process whose stderr lines are kept. */
export class KcoralProcess {
  readonly child: Deno.ChildProcess;
  readonly lines: string[] = [];
  readonly #waiters: { test: (line: string) => boolean; resolve: (line: string) => void }[] = [];
  readonly status: Promise<Deno.CommandStatus>;

  constructor(args: string[], env: Record<string, string> = {}) {
    this.child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, ...args],
      env: { NO_COLOR: "1", ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.status = this.child.status;
    this.#collect(this.child.stderr);
    this.#collect(this.child.stdout);
  }

  async #collect(stream: ReadableStream<Uint8Array>): Promise<void> {
    const decoder = new TextDecoder();
    let rest = "";
    try {
      for await (const chunk of stream) {
        rest += decoder.decode(chunk, { stream: true });
        let at: number;
        while ((at = rest.indexOf("\n")) >= 0) {
          const line = rest.slice(0, at);
          rest = rest.slice(at + 1);
          this.lines.push(line);
          for (const waiter of [...this.#waiters]) {
            if (waiter.test(line)) {
              this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
              waiter.resolve(line);
            }
          }
        }
      }
    } catch {
      // the process went away
    }
  }

  /** Resolves with the first line (already seen or to come) that matches. */
  waitForLine(pattern: RegExp, timeoutMs = 30_000): Promise<string> {
    const seen = this.lines.find((line) => pattern.test(line));
    if (seen) return Promise.resolve(seen);
    return new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`no line ${pattern} in time:\n${this.lines.slice(-30).join("\n")}`));
      }, timeoutMs);
      this.#waiters.push({
        test: (line) => pattern.test(line),
        resolve: (line) => (clearTimeout(timer), resolve(line)),
      });
    });
  }

  /** Sends `signal` (ignored once the process is gone). */
  kill(signal: Deno.Signal = "SIGTERM"): void {
    try {
      this.child.kill(signal);
    } catch {
      // already exited
    }
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status. */
  async stop(graceMs = 15_000): Promise<Deno.CommandStatus> {
    this.kill("SIGTERM");
    const timer = setTimeout(() => this.kill("SIGKILL"), graceMs);
    const status = await this.status;
    clearTimeout(timer);
    return status;
  }
}

/** A Router process. */
export interface TestRouter {
  url: string;
  process: KcoralProcess;
  /** The parsed `request_finished` lines. */
  finished(): Record<string, string>[];
  stop(): Promise<Deno.CommandStatus>;
}

/** Starts `kcoral router` on a free port with quick health settings and `extra` arguments. */
export async function startRouter(
  extra: string[] = [],
  env: Record<string, string> = {},
): Promise<TestRouter> {
  const port = freePort();
  const process = new KcoralProcess([
    "router",
    "--port",
    String(port),
    "--status-check-interval-seconds",
    "0.1",
    "--recovery-threshold",
    "1",
    ...extra,
  ], env);
  await process.waitForLine(/KCoral router listening on /);
  return {
    url: `http://127.0.0.1:${port}`,
    process,
    finished: () => process.lines.filter((l) => / request_finished /.test(l)).map(parseLogLine),
    stop: () => process.stop(),
  };
}

/** The `key=value` fields of a console event line. */
export function parseLogLine(line: string): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const match of line.matchAll(/(\w+)=("(?:[^"\\]|\\.)*"|\S*)/g)) {
    fields[match[1]] = match[2].startsWith('"') ? JSON.parse(match[2]) : match[2];
  }
  return fields;
}

/** A node process (supervisor + server). */
export interface TestNode {
  nodeId: string;
  port: number;
  logDir: string;
  process: KcoralProcess;
  /** The server's `events.jsonl` records so far. */
  events(): Record<string, unknown>[];
  stop(): Promise<Deno.CommandStatus>;
}

/** Quick supervisor settings for tests (hidden options of `kcoral server`). */
export const QUICK_SUPERVISOR = [
  "--health-interval-seconds",
  "0.2",
  "--health-timeout-seconds",
  "1",
  "--startup-grace-seconds",
  "30",
  "--restart-min-delay-seconds",
  "0.2",
  "--restart-max-delay-seconds",
  "1",
  "--restart-jitter",
  "0",
];

/** Starts a CPU node `nodeId` joined to `routerUrl` with `workers` workers. */
export async function startNode(
  routerUrl: string,
  nodeId: string,
  options: { workers?: number; extra?: string[]; env?: Record<string, string> } = {},
): Promise<TestNode> {
  const port = freePort();
  const logDir = await Deno.makeTempDir({ prefix: `kcoral-node-${nodeId}-` });
  const process = new KcoralProcess([
    "server",
    "--router",
    routerUrl,
    "--node-id",
    nodeId,
    "--device",
    "cpu",
    "--num-workers",
    String(options.workers ?? 1),
    "--sandbox",
    "none",
    "--port",
    String(port),
    "--log-dir",
    logDir,
    "--disk-cache-dir",
    "",
    ...QUICK_SUPERVISOR,
    ...(options.extra ?? []),
  ], options.env);
  return {
    nodeId,
    port,
    logDir,
    process,
    events: () => readEvents(logDir),
    async stop() {
      const status = await process.stop();
      await Deno.remove(logDir, { recursive: true }).catch(() => {});
      return status;
    },
  };
}

/** Every `events.jsonl` record under `logDir` (all server starts). */
export function readEvents(logDir: string): Record<string, unknown>[] {
  const records: Record<string, unknown>[] = [];
  let runs: Deno.DirEntry[] = [];
  try {
    runs = [...Deno.readDirSync(`${logDir}/runs`)].sort((a, b) => a.name < b.name ? -1 : 1);
  } catch {
    return records;
  }
  for (const run of runs) {
    try {
      const text = Deno.readTextFileSync(`${logDir}/runs/${run.name}/events.jsonl`);
      for (const line of text.split("\n")) if (line) records.push(JSON.parse(line));
    } catch {
      // not written yet
    }
  }
  return records;
}

/** A Router's `/health` body. */
export interface RouterHealth {
  status: string;
  load: { request_capacity: number; requests_in_progress: number; requests_waiting: number };
  target: Record<string, string>;
  versions: Record<string, string>;
  gpu_count: null;
  instance_id: string;
  started_at: string;
}

/** The Router's `/health` body and status. */
export async function routerHealth(
  url: string,
): Promise<{ status: number; body: RouterHealth }> {
  const response = await fetch(`${url}/health`);
  return { status: response.status, body: await response.json() };
}

/** Polls `check` until it returns true (every 50 ms) or fails after `timeoutMs`. */
export async function waitUntil(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 60_000,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Waits until the Router's `/health` reports `capacity` slots of ready nodes. */
export function waitForCapacity(url: string, capacity: number, timeoutMs = 60_000): Promise<void> {
  return waitUntil(`request_capacity ${capacity}`, async () => {
    const { body } = await routerHealth(url);
    return body.load?.request_capacity === capacity;
  }, timeoutMs);
}
