/**
 * Test helper: a real KCoral server on loopback (real HTTP, real Python workers), with events
 * captured in memory.
 */
import assert from "node:assert/strict";
import { appInternals, type AppOptions, createApp } from "../server/app.ts";
import type { WorkerPool } from "../server/workers/pool.ts";
import type { ServerConfig } from "../server/config.ts";
import type { ServerStatusData } from "../server/status.ts";
import { type RunningServer, serve, type ServeOptions } from "../http/serve.ts";

/** A server started for a test. */
export interface TestServer {
  url: string;
  server: RunningServer;
  events: Record<string, unknown>[];
  config: ServerConfig;
  app: ReturnType<typeof createApp>;
  pool: WorkerPool;
  stop(): Promise<void>;
}

/**
 * An application without a listener (its `execute` called directly): a quiet CPU configuration,
 * `config` merged over it, and its events captured. Not started.
 */
export function testApp(config: Partial<ServerConfig> = {}): {
  app: ReturnType<typeof createApp>;
  events: Record<string, unknown>[];
} {
  const app = createApp({
    device: "cpu",
    sandbox: "none",
    logConsole: false,
    logDir: null,
    diskCacheDir: null,
    ...config,
  });
  const events: Record<string, unknown>[] = [];
  app.subscribe((e) => events.push(e));
  return { app, events };
}

/** Options merged over a fast, isolated default configuration. */
export async function startServer(
  config: Partial<ServerConfig> = {},
  options: AppOptions = {},
  serveOptions: ServeOptions = {},
): Promise<TestServer> {
  const diskCacheDir = config.diskCacheDir === undefined
    ? await Deno.makeTempDir({ prefix: "kcoral-test-disk-" })
    : config.diskCacheDir;
  const app = createApp({
    device: "cpu",
    numWorkers: 1,
    sandbox: "none",
    logDir: null,
    logConsole: false,
    ...config,
    diskCacheDir,
  }, options);
  const events: Record<string, unknown>[] = [];
  app.subscribe((record) => events.push(record));
  const server = await serve(app, {
    port: 0,
    handleSignals: false,
    log: () => {},
    ...serveOptions,
  });
  return {
    url: server.url,
    server,
    events,
    config: app.config,
    app,
    pool: appInternals(app).pool!,
    async stop() {
      await server.shutdown();
      if (config.diskCacheDir === undefined && diskCacheDir) {
        await Deno.remove(diskCacheDir, { recursive: true }).catch(() => {});
      }
    },
  };
}

/** A CPU server and a simulated-GPU server, for tests that run in both modes. */
export const MODES: { name: string; config: Partial<ServerConfig> }[] = [
  { name: "cpu", config: { device: "cpu", numWorkers: 1 } },
  {
    name: "simulated-gpu",
    config: { device: "gpu", simulateGpus: true, gpus: [0], workersPerGpu: 1 },
  },
];

/** Builds a multipart body by hand (for malformed-request tests). */
export function multipartBody(
  parts: {
    name: string;
    contentType?: string;
    body: string | Uint8Array;
    extraHeaders?: string[];
  }[],
  boundary = "testboundary1234",
): { body: Uint8Array<ArrayBuffer>; contentType: string } {
  const encoder = new TextEncoder();
  const chunks: Uint8Array[] = [];
  for (const part of parts) {
    let head = `--${boundary}\r\nContent-Disposition: form-data; name="${part.name}"\r\n`;
    if (part.contentType) head += `Content-Type: ${part.contentType}\r\n`;
    for (const h of part.extraHeaders ?? []) head += `${h}\r\n`;
    head += "\r\n";
    chunks.push(encoder.encode(head));
    chunks.push(typeof part.body === "string" ? encoder.encode(part.body) : part.body);
    chunks.push(encoder.encode("\r\n"));
  }
  chunks.push(encoder.encode(`--${boundary}--\r\n`));
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const body = new Uint8Array(total);
  let offset = 0;
  for (const c of chunks) {
    body.set(c, offset);
    offset += c.length;
  }
  return { body, contentType: `multipart/form-data; boundary=${boundary}` };
}

/** Posts a raw program JSON to /execute. */
export async function postProgram(
  url: string,
  program: unknown,
  init: { headers?: Record<string, string>; blobs?: Record<string, Uint8Array> } = {},
): Promise<{ status: number; headers: Headers; json: Record<string, unknown> }> {
  const parts: { name: string; contentType: string; body: string | Uint8Array }[] = [{
    name: "program",
    contentType: "application/json",
    body: typeof program === "string" ? program : JSON.stringify(program),
  }];
  for (const [sha, bytes] of Object.entries(init.blobs ?? {})) {
    parts.push({ name: `blob:${sha}`, contentType: "application/octet-stream", body: bytes });
  }
  const { body, contentType } = multipartBody(parts);
  const response = await fetch(`${url}/execute`, {
    method: "POST",
    body,
    headers: { "content-type": contentType, ...init.headers },
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, json: JSON.parse(text) };
}

/** A program that uploads `source` and runs `name(*args)`, returning the result as `key`. */
export function callProgram(source: string, name: string, args: unknown[] = [], key = "out") {
  return {
    instructions: [
      { op: "upload", id: "m", kind: "module", source },
      { op: "get_function", id: "f", module: { $ref: "m" }, name },
      { op: "run", id: "r", fn: { $ref: "f" }, args },
      { op: "return", key, value: { $ref: "r" } },
    ],
  };
}

/**
 * Python lines that let a program keep its fresh worker's process alive after the answer: call
 * `outlive_answer(seconds)` from the program. A thread keeps putting streams in place of
 * `sys.stdout` and `sys.stderr` (the answer restores them) whose flush, when the process's exit
 * calls it (`_flush_all`, runtime_py/kcoral_runtime/child.py), waits until the deadline;
 * `_outlive["deadline"] = 0` ends the wait early.
 */
export const OUTLIVE_ANSWER = `import sys, threading, time

_outlive = {"deadline": 0.0}

class _Stall:
    def write(self, text):
        return len(text)

    def flush(self):
        if sys._getframe(1).f_code.co_name == "_flush_all":  # the process's exit
            while time.time() < _outlive["deadline"]:
                time.sleep(0.01)

def _keep_stalls():
    while time.time() < _outlive["deadline"]:
        sys.stdout, sys.stderr = _Stall(), _Stall()
        time.sleep(0.001)

def outlive_answer(seconds):
    _outlive["deadline"] = time.time() + seconds
    sys.__stdout__, sys.__stderr__ = _Stall(), _Stall()
    threading.Thread(target=_keep_stalls, daemon=True).start()
`;

/** One GPU's lease holds as `/status/data` lists them. */
export type StatusHolds = ServerStatusData["gpus"][number]["holds"];

/**
 * Asserts that no request's hold overlaps any other hold on the GPU (a context creation may
 * overlap a retiring worker's teardown: neither is a request).
 */
export function assertRequestHoldsAlone(holds: StatusHolds): void {
  for (const request of holds.filter((h) => !h.initialization && !h.teardown)) {
    for (const other of holds) {
      if (other === request) continue;
      assert.ok(
        other.to <= request.from || other.from >= request.to,
        JSON.stringify({ request, other }),
      );
    }
  }
}
