/**
 * Shared pieces of the diagnostic probes: a `kcoral server` in its own process, the 64 MiB
 * `c = a + b` program of the server bench, and reading the probes' command lines.
 *
 * @module
 */
import type { Program } from "../../mod.ts";
import { addProgram, randomFloats } from "../_programs.ts";

const _CLI = new URL("../../cli.ts", import.meta.url).pathname;

/** A server process on loopback. */
export interface ServerProcess {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  /** The server process. */
  child: Deno.ChildProcess;
  /** Its standard output so far (e.g. V8's `--trace-gc` lines; block-buffered until exit). */
  stdout: string[];
  /** `performance.now()` when it was spawned (V8 trace times count from about then). */
  spawnedAt: number;
  /** Stops it (SIGTERM) and waits for it; a second call waits for the same exit. */
  stop(): Promise<void>;
}

/**
 * Starts `kcoral server` with `serverArgs` after `--port`, `--no-log-console` and `--sandbox none`
 * (later flags win), `denoFlags` before the script (e.g. `--v8-flags=--trace-gc`), and waits until
 * it serves. `gpu` picks a real GPU 0; otherwise simulated GPUs. `tree`: another checkout to run
 * it from (its own `cli.ts` and `deno.json`), for A/B probes.
 */
export async function startServerProcess(
  serverArgs: string[],
  options: { gpu?: boolean; denoFlags?: string[]; tree?: string } = {},
): Promise<ServerProcess> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const spawnedAt = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      ...(options.denoFlags ?? []),
      options.tree ? `${options.tree}/cli.ts` : _CLI,
      "server",
      "--port",
      String(port),
      "--no-log-console",
      "--sandbox",
      "none",
      "--device",
      "gpu",
      "--gpus",
      "0",
      ...(options.gpu ? [] : ["--simulate-gpus"]),
      ...serverArgs,
    ],
    cwd: options.tree,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdout: string[] = [];
  (async () => {
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) stdout.push(chunk);
  })();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (!seen.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the server exited:\n${seen}`);
    seen += value;
  }
  (async () => {
    while (!(await reader.read()).done) { /* drained */ }
  })();
  let stopped: Promise<void> | null = null;
  return {
    url: `http://127.0.0.1:${port}`,
    child,
    stdout,
    spawnedAt,
    stop() {
      stopped ??= (async () => {
        child.kill("SIGTERM");
        await child.status;
      })();
      return stopped;
    },
  };
}

/**
 * A server with `workers` reused workers per GPU (`--max-requests-per-worker 0`), no disk cache,
 * its event log in `logDir` (none by default), and `extra` flags after those.
 */
export function startReusedServer(
  workers: number | string,
  options: { gpu?: boolean; denoFlags?: string[]; logDir?: string; extra?: string[] } = {},
): Promise<ServerProcess> {
  return startServerProcess([
    "--log-dir",
    options.logDir ?? "",
    "--max-requests-per-worker",
    "0",
    "--disk-cache-dir",
    "",
    "--workers-per-gpu",
    String(workers),
    ...(options.extra ?? []),
  ], { gpu: options.gpu, denoFlags: options.denoFlags });
}

/** The server bench's `c = a + b` over two new tensors of `n` random float32 values. */
export function randomAddProgram(n = 16 << 20): Program {
  return addProgram(randomFloats(n), randomFloats(n));
}

/** Median of `values`. */
export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1];
}

/** The server's request events from a `--log-dir`, by request id. */
export function requestEvents(logDir: string): Map<string, Record<string, unknown>[]> {
  const runs = [...Deno.readDirSync(`${logDir}/runs`)].map((e) => e.name).sort();
  const text = Deno.readTextFileSync(`${logDir}/runs/${runs.at(-1)}/events.jsonl`);
  const byRequest = new Map<string, Record<string, unknown>[]>();
  for (const line of text.trim().split("\n")) {
    const event = JSON.parse(line);
    if (typeof event.request_id !== "string") continue;
    byRequest.set(event.request_id, [...(byRequest.get(event.request_id) ?? []), event]);
  }
  return byRequest;
}

/**
 * `count` POSTs of a one-byte body to `url`/execute with `fetch` (keep-alive), one at a time,
 * each answer read whole; their times in ms.
 */
export async function timeOneBytePosts(url: string, count: number): Promise<number[]> {
  const body = new Uint8Array([120]);
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const start = performance.now();
    const response = await fetch(`${url}/execute`, {
      method: "POST",
      body,
      headers: { "content-type": "application/octet-stream" },
    });
    await response.arrayBuffer();
    times.push(performance.now() - start);
  }
  return times;
}

/** The number after `name` (`--requests 8`) on the command line, or `fallback`. */
export function numberArg(name: string, fallback: number): number {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Number(Deno.args[at + 1]) : fallback;
}

/** The command line's positional arguments (checkouts): not `--name`, its value, nor `gpu`. */
export function positionalArgs(): string[] {
  return Deno.args.filter((arg, i) =>
    !arg.startsWith("--") && !Deno.args[i - 1]?.startsWith("--") && arg !== "gpu"
  );
}
