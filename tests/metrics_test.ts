/**
 * `GET /metrics` on a real CPU server, a simulated-GPU server and through a real Router with a
 * node, read with the official Prometheus client's text-format parser
 * (`tests/_prometheus_parse.py`, `prometheus_client.parser`): the families exist with HELP and
 * TYPE, and the counters move with the requests just made.
 */
import assert from "node:assert/strict";
import { Client } from "../mod.ts";
import { callProgram, postProgram, startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";
import { lengthProgram } from "../bench/_programs.ts";
import { outputWithInput } from "./_child.ts";

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number | string;
}
interface Family {
  name: string;
  type: string;
  help: string;
  samples: Sample[];
}
interface Scraped {
  families: Map<string, Family>;
  samples: Sample[];
}

const PARSER = new URL("./_prometheus_parse.py", import.meta.url).pathname;

/** An interpreter with the official Prometheus client (Debian's package is for /usr/bin/python3). */
async function parserPython(): Promise<string> {
  for (const python of ["python3", "/usr/bin/python3"]) {
    const probe = await new Deno.Command(python, {
      args: ["-c", "import prometheus_client"],
      stdout: "null",
      stderr: "null",
    }).output().catch(() => null);
    if (probe?.success) return python;
  }
  throw new Error("no python3 with prometheus_client (scripts/setup.sh installs it)");
}

/** Scrapes `url`/metrics and reads it with the official client's parser. */
async function scrape(url: string): Promise<Scraped> {
  const response = await fetch(`${url}/metrics`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  const text = await response.text();
  const output = await outputWithInput(await parserPython(), [PARSER], text);
  assert.ok(output.success, new TextDecoder().decode(output.stderr));
  const families = JSON.parse(new TextDecoder().decode(output.stdout)) as Family[];
  return {
    families: new Map(families.map((f) => [f.name, f])),
    samples: families.flatMap((f) => f.samples),
  };
}

/** The sample `name` whose labels include `labels` (0 when there is none). */
function value(scraped: Scraped, name: string, labels: Record<string, string> = {}): number {
  const sample = scraped.samples.find((s) =>
    s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)
  );
  return sample === undefined ? 0 : Number(sample.value);
}

/** The sum of every sample `name` (e.g. a histogram's `_count` over its label values). */
function total(scraped: Scraped, name: string): number {
  return scraped.samples.filter((s) => s.name === name).reduce((n, s) => n + Number(s.value), 0);
}

Deno.test("metrics: a CPU server's counters, histograms and gauges move with real requests", async () => {
  const server = await startServer();
  try {
    const before = await scrape(server.url);
    // Family names as the parser reports them (a counter's without its `_total`).
    const expected: [string, string][] = [
      ["kcoral_requests", "counter"],
      ["kcoral_request_queue_seconds", "histogram"],
      ["kcoral_lease_wait_seconds", "histogram"],
      ["kcoral_lease_held_seconds", "histogram"],
      ["kcoral_requests_in_flight", "gauge"],
      ["kcoral_requests_queued", "gauge"],
      ["kcoral_workers", "gauge"],
      ["kcoral_worker_replacements", "counter"],
      ["kcoral_worker_replacement_seconds", "histogram"],
      ["kcoral_cache_hits", "counter"],
      ["kcoral_cache_misses", "counter"],
      ["kcoral_cache_evictions", "counter"],
      ["kcoral_cache_bytes", "gauge"],
      ["kcoral_request_bytes", "counter"],
      ["kcoral_response_bytes", "counter"],
    ];
    for (const [name, type] of expected) {
      const family = before.families.get(name);
      assert.ok(family, name);
      assert.equal(family.type, type, name);
      assert.ok(family.help.length > 10, `${name} has HELP`);
    }
    assert.equal(value(before, "kcoral_workers", { device: "cpu", state: "idle" }), 1);

    await using client = new Client(server.url);
    const payload = new Uint8Array(4096).fill(7);
    for (let i = 0; i < 3; i++) {
      assert.equal((await client.execute(lengthProgram(payload))).get("n"), 4096);
    }
    // A program that fails, and a malformed request.
    const failed = await postProgram(
      server.url,
      callProgram("def f():\n    raise ValueError('no')\n", "f"),
    );
    assert.equal(failed.status, 200);
    const malformed = await fetch(`${server.url}/execute`, { method: "POST", body: "x" });
    assert.equal(malformed.status, 400);
    await malformed.body?.cancel();

    const after = await scrape(server.url);
    const completed = { code: "200", finish_reason: "completed", error_kind: "none" };
    assert.equal(value(after, "kcoral_requests_total", completed), 3);
    // The first request named the blob by hash: CACHE_MISS, then it came along.
    assert.equal(
      value(after, "kcoral_requests_total", { code: "200", finish_reason: "cache_miss" }),
      1,
    );
    const failure = after.samples.find((m) =>
      m.name === "kcoral_requests_total" && m.labels.code === "200" &&
      m.labels.finish_reason !== "completed" && m.labels.finish_reason !== "cache_miss"
    );
    assert.ok(failure, JSON.stringify(after.families.get("kcoral_requests")));
    assert.notEqual(failure.labels.error_kind, "none");
    assert.equal(value(after, "kcoral_requests_total", { code: "400" }), 1);
    // One observation per program that ran (3 + the failing one), on gpu="cpu".
    assert.equal(value(after, "kcoral_request_queue_seconds_count", { gpu: "cpu" }), 4);
    assert.equal(value(after, "kcoral_lease_held_seconds_count", { gpu: "cpu" }), 4);
    // The blob: missed once (CACHE_MISS), then found twice.
    assert.equal(value(after, "kcoral_cache_misses_total", { cache: "memory" }), 1);
    assert.equal(value(after, "kcoral_cache_hits_total", { cache: "memory" }), 2);
    assert.ok(value(after, "kcoral_cache_bytes", { cache: "memory" }) >= 4096);
    assert.ok(value(after, "kcoral_request_bytes_total") > 4096);
    assert.ok(value(after, "kcoral_response_bytes_total") > 0);
    assert.equal(value(after, "kcoral_requests_in_flight"), 0);
    // No request id or path ever becomes a label value.
    for (const sample of after.samples) {
      for (const v of Object.values(sample.labels)) {
        assert.doesNotMatch(v, /^[0-9a-f]{8}-[0-9a-f]{4}-|\//, `${sample.name} label ${v}`);
      }
    }
  } finally {
    await server.stop();
  }
});

Deno.test("metrics: lease wait and hold per GPU on a simulated-GPU server", async () => {
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0, 1],
    workersPerGpu: 1,
  });
  try {
    await using client = new Client(server.url);
    for (let i = 0; i < 4; i++) {
      assert.equal((await client.execute(lengthProgram(new Uint8Array(8)))).get("n"), 8);
    }
    const scraped = await scrape(server.url);
    const held = scraped.samples.filter((s) => s.name === "kcoral_lease_held_seconds_count");
    assert.ok(held.length > 0 && held.every((m) => ["0", "1"].includes(m.labels.gpu)));
    // 4 programs ran (the CACHE_MISS round runs nothing).
    assert.equal(total(scraped, "kcoral_lease_held_seconds_count"), 4);
    assert.equal(total(scraped, "kcoral_lease_wait_seconds_count"), 4);
    // Two seats (fresh workers: each is replaced after its request, so states vary).
    assert.equal(total(scraped, "kcoral_workers"), 2);
    assert.ok(
      scraped.samples.every((s) => s.name !== "kcoral_workers" || s.labels.device === "gpu"),
    );
    assert.equal(total(scraped, "kcoral_worker_replacements_total"), 4);
  } finally {
    await server.stop();
  }
});

Deno.test({
  name: "metrics: the Router counts forwarded and refused requests, and its nodes",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const router = await startRouter(["--queue-wait-timeout-seconds", "0.2"]);
    let node;
    try {
      // No node yet: a refusal the Router makes itself.
      const refused = await fetch(`${router.url}/execute`, { method: "POST", body: "{}" });
      assert.equal(refused.status, 503);
      await refused.body?.cancel();
      node = await startNode(router.url, "cpu-metrics");
      await waitForCapacity(router.url, 1);
      await using client = new Client(router.url);
      for (let i = 0; i < 2; i++) {
        assert.equal((await client.execute(lengthProgram(new Uint8Array(10)))).get("n"), 10);
      }
      // The log line (and the counter) come right after the answer.
      let families = await scrape(router.url);
      for (let i = 0; i < 50; i++) {
        if (
          value(families, "kcoral_router_requests_total", { code: "200", outcome: "completed" }) >=
            3
        ) break;
        await new Promise((r) => setTimeout(r, 20));
        families = await scrape(router.url);
      }
      // 2 programs + the CACHE_MISS round of the first (also a completed 200 forward).
      assert.equal(
        value(families, "kcoral_router_requests_total", { code: "200", outcome: "completed" }),
        3,
      );
      assert.equal(
        value(families, "kcoral_router_requests_total", { code: "503", error_kind: "no_node" }),
        1,
      );
      assert.equal(value(families, "kcoral_router_nodes", { state: "ready" }), 1);
      assert.equal(value(families, "kcoral_router_node_capacity", { node: "cpu-metrics" }), 1);
      assert.equal(value(families, "kcoral_router_node_busy", { node: "cpu-metrics" }), 0);
      assert.equal(value(families, "kcoral_router_queue_length"), 0);
      assert.ok(value(families, "kcoral_router_queue_wait_seconds_count") >= 4);
      assert.ok(value(families, "kcoral_router_request_bytes_total") > 0);
      assert.equal(families.families.get("kcoral_router_queue_wait_seconds")!.type, "histogram");
    } finally {
      await node?.stop();
      await router.stop();
    }
  },
});

/**
 * The operator's basics on one `/metrics`: build info, process metrics, capacity, durations.
 * `startedAfterS`: a Unix time (seconds) before the scraped process started.
 */
function assertOperatorBasics(scraped: Scraped, capacity: string, startedAfterS: number): void {
  const build = scraped.samples.find((s) => s.name === "kcoral_build_info");
  assert.ok(build, "kcoral_build_info");
  assert.equal(Number(build.value), 1);
  assert.match(build.labels.version, /^\d+\.\d+\.\d+/);
  assert.equal(build.labels.deno, Deno.version.deno);
  // prom-client's process metrics, read from /proc under Deno.
  const fds = value(scraped, "process_open_fds");
  assert.ok(fds > 3 && fds < value(scraped, "process_max_fds"), `open fds ${fds}`);
  assert.ok(value(scraped, "process_resident_memory_bytes") > 1 << 20);
  assert.ok(value(scraped, "process_cpu_seconds_total") > 0);
  // A Unix time in whole seconds (rounded): not before `startedAfterS`, not after the scrape.
  const start = value(scraped, "process_start_time_seconds");
  assert.ok(
    Math.floor(startedAfterS) - 1 <= start && start <= Math.ceil(Date.now() / 1000),
    `started ${start}, expected from ${startedAfterS}`,
  );
  assert.ok(![...scraped.families.keys()].some((name) => name.startsWith("nodejs_")));
  assert.ok(value(scraped, capacity) >= 1, capacity);
}

Deno.test({
  name: "metrics: build info, process metrics, capacity and request durations (server, Router)",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const routerStartedAfter = Date.now() / 1000;
    const router = await startRouter([]);
    let node;
    try {
      node = await startNode(router.url, "cpu-basics");
      await waitForCapacity(router.url, 1);
      await using client = new Client(router.url);
      assert.equal((await client.execute(lengthProgram(new Uint8Array(10)))).get("n"), 10);
      let routed = await scrape(router.url);
      for (
        let i = 0;
        i < 50 && total(routed, "kcoral_router_request_duration_seconds_count") < 2;
        i++
      ) {
        await new Promise((r) => setTimeout(r, 20));
        routed = await scrape(router.url);
      }
      assertOperatorBasics(routed, "kcoral_router_capacity", routerStartedAfter);
      // The CACHE_MISS round and the program, each from receipt to finish.
      assert.equal(total(routed, "kcoral_router_request_duration_seconds_count"), 2);
      assert.equal(
        routed.families.get("kcoral_router_request_duration_seconds")!.type,
        "histogram",
      );
    } finally {
      await node?.stop();
      await router.stop();
    }
    const server = await startServer();
    try {
      // Before any request: a fresh-worker server's seat is being replaced after each one.
      // This process serves it: it started at its time origin.
      const origin = performance.timeOrigin / 1000;
      assertOperatorBasics(await scrape(server.url), "kcoral_request_capacity", origin);
      await using client = new Client(server.url);
      assert.equal((await client.execute(lengthProgram(new Uint8Array(10)))).get("n"), 10);
      const scraped = await scrape(server.url);
      assert.equal(value(scraped, "kcoral_request_duration_seconds_count", { gpu: "cpu" }), 2);
      assert.ok(value(scraped, "kcoral_cache_capacity_bytes", { cache: "memory" }) > 0);
    } finally {
      await server.stop();
    }
  },
});

/** The metric names of the table under `heading` in docs/operations.md. */
async function documented(heading: string): Promise<string[]> {
  const text = await Deno.readTextFile(new URL("../docs/operations.md", import.meta.url));
  const section = text.slice(text.indexOf(`${heading}\n`)).split(/\n#{2,3} /)[0];
  return [...section.matchAll(/^\| `(kcoral_[a-z_]+|process_\*)`/gm)].map((m) => m[1]).sort();
}

/** The metric names a scrape serves (`process_*` as one), as the exposition names them. */
function served(scraped: Scraped): string[] {
  const names = new Set<string>();
  for (const family of scraped.families.values()) {
    if (family.name.startsWith("process_")) names.add("process_*");
    else names.add(family.type === "counter" ? `${family.name}_total` : family.name);
  }
  return [...names].sort();
}

Deno.test({
  name: "metrics: docs/operations.md lists exactly what a server's and a Router's /metrics serve",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const server = await startServer();
    try {
      assert.deepEqual(served(await scrape(server.url)), await documented("### Server"));
    } finally {
      await server.stop();
    }
    const router = await startRouter([]);
    try {
      assert.deepEqual(served(await scrape(router.url)), await documented("### Router"));
    } finally {
      await router.stop();
    }
  },
});
