/**
 * The GPU gate end to end (issue 41, docs/decisions/script-gpu-gate.md "A script holds the GPU only while it
 * uses it"): a simulated-GPU server builds the gate's shim at startup, and a `kcoral run python`
 * request whose script starts a process that calls a stand-in CUDA driver
 * (runtime_py/tests/fixtures/gate/fake_libcuda.c, compiled by the script itself, so that it
 * exists inside a sandbox too) holds the lease only while that process lives: its sleep after
 * the process is gone is not under the lease. Without a sandbox, under bubblewrap, and through a
 * Router; `--no-gpu-gate` is the control (the whole run under the lease). A burst of scripts on
 * fresh workers: the replacements initialized while requests wait defer their contexts, so their
 * scripts' requests leave no context to create or tear down under the lease.
 */
import assert from "node:assert/strict";
import { Client } from "../client/mod.ts";
import { decodeOutcome } from "../cli/run/outcome.ts";
import { buildToolProgram } from "../cli/run/program.ts";
import { readToolSources } from "../cli/run/sources.ts";
import { writeTar } from "../cli/run/tar.ts";
import type { ServerConfig } from "../server/config.ts";
import type { ServerStatusData } from "../server/status.ts";
import { startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";

const GPU_SECONDS = 0.5;
const SLEEP_SECONDS = 2;
const FAKE_DRIVER = new URL("../runtime_py/tests/fixtures/gate/fake_libcuda.c", import.meta.url);

/**
 * Compiles the stand-in driver, runs a process that uses it for GPU_SECONDS, then sleeps. Prints
 * the driver's log, then the monotonic clock (ns) at four points: before the CUDA process
 * starts, once it has its context, its last moment, and the end of the sleep after it.
 */
const SCRIPT = `
import json, os, subprocess, sys, time
os.makedirs("drv", exist_ok=True)
subprocess.run(["cc", "-shared", "-fPIC", "fake_libcuda.c", "-o", "drv/libcuda.so.1",
                "-ldl", "-lpthread"], check=True)
code = ("import ctypes, time; lib = ctypes.CDLL('libcuda.so.1'); assert lib.cuInit(0) == 0; "
        "c = ctypes.c_void_p(); assert lib.cuCtxCreate_v2(ctypes.byref(c), 0, 0) == 0; "
        "ctx = time.monotonic_ns(); time.sleep(${GPU_SECONDS}); print(ctx, time.monotonic_ns())")
env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath("drv"), FAKE_CUDA_LOG=os.path.abspath("log"))
start = time.monotonic_ns()
gpu = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
ctx, last = map(int, gpu.stdout.split())
time.sleep(${SLEEP_SECONDS})  # no CUDA here: outside the lease
slept = time.monotonic_ns()
print(" ".join(line.split()[0] for line in open("log")))
print(json.dumps({"start": start, "ctx": ctx, "last": last, "slept": slept}))
`;

/** A run's lease hold and what its script printed. */
interface ScriptRun {
  heldMs: number;
  log: string;
  /** The script's clock reads (ns): `start`, `ctx`, `last`, `slept`. */
  at: Record<"start" | "ctx" | "last" | "slept", number>;
}

/** Milliseconds between two of a script's clock reads. */
function between(run: ScriptRun, from: keyof ScriptRun["at"], to: keyof ScriptRun["at"]): number {
  return (run.at[to] - run.at[from]) / 1e6;
}

const SIM: Partial<ServerConfig> = {
  device: "gpu",
  simulateGpus: true,
  gpus: [0],
  workersPerGpu: 1,
};

async function runScript(url: string): Promise<ScriptRun> {
  const encoder = new TextEncoder();
  const archive = writeTar([
    { name: "script.py", data: encoder.encode(SCRIPT), mode: 0o600 },
    { name: "fake_libcuda.c", data: await Deno.readFile(FAKE_DRIVER), mode: 0o600 },
  ]);
  const { program, options } = buildToolProgram(await readToolSources("python"), archive, {
    forwarded: ["script.py"],
    env: {},
    fetch: [],
    timeoutSeconds: 120,
    outputLimitBytes: 1 << 16,
  });
  await using client = new Client(url);
  const result = await client.execute(program, options);
  assert.ok(result.completed, JSON.stringify(result.error));
  assert.equal(decodeOutcome(result.get("outcome")).returncode, 0, result.stderr);
  const [log, at] = result.stdout.trim().split("\n");
  return { heldMs: result.leaseHeldMs, log, at: JSON.parse(at) };
}

function assertGated(run: ScriptRun): void {
  assert.equal(run.log, "init use"); // the gate let the driver in
  // The lease is taken at the first CUDA call (before the context) and given back when the
  // CUDA process ends: it covers the process from its context to its last moment, and it was
  // back before the script's sleep after it ended (held through that sleep, it would count
  // at least from the context to the sleep's end).
  const detail = `lease held ${run.heldMs} ms; ${JSON.stringify(run.at)}`;
  assert.ok(run.heldMs >= between(run, "ctx", "last"), detail);
  assert.ok(run.heldMs < between(run, "ctx", "slept"), detail);
}

Deno.test("gpu gate: a script holds the lease only while its CUDA process lives", async (t) => {
  for (const sandbox of ["none", "bubblewrap"] as const) {
    await t.step(`sandbox ${sandbox}`, async () => {
      const server = await startServer({ ...SIM, sandbox });
      try {
        assert.equal(server.app.sandbox, sandbox);
        assert.ok(!server.events.some((e) => e.event === "gpu_gate_unavailable"));
        assertGated(await runScript(server.url));
        assertGated(await runScript(server.url)); // the next worker too
      } finally {
        await server.stop();
      }
    });
  }
});

Deno.test("gpu gate: --no-gpu-gate holds the lease for the whole run", async () => {
  const server = await startServer({ ...SIM, gpuGate: false });
  try {
    const run = await runScript(server.url);
    assert.equal(run.log, "init use");
    // Held from before the script started to after its sleep ended.
    const detail = `lease held ${run.heldMs} ms; ${JSON.stringify(run.at)}`;
    assert.ok(run.heldMs >= between(run, "start", "slept"), detail);
  } finally {
    await server.stop();
  }
});

Deno.test("gpu gate: through a Router", async () => {
  const router = await startRouter();
  const node = await startNode(router.url, "sim-a", {
    extra: ["--device", "gpu", "--simulate-gpus", "--gpus", "0", "--workers-per-gpu", "1"],
  });
  try {
    await waitForCapacity(router.url, 1);
    assertGated(await runScript(router.url));
  } finally {
    await node.stop();
    await router.stop();
  }
});

/** Runs `kcoral run python` with a script that never calls CUDA; its request id. */
async function runPlainScript(url: string): Promise<string> {
  const archive = writeTar([
    { name: "script.py", data: new TextEncoder().encode("print('no CUDA here')\n"), mode: 0o600 },
  ]);
  const { program, options } = buildToolProgram(await readToolSources("python"), archive, {
    forwarded: ["script.py"],
    env: {},
    fetch: [],
    timeoutSeconds: 120,
    outputLimitBytes: 1 << 16,
  });
  await using client = new Client(url);
  const result = await client.execute(program, options);
  assert.ok(result.completed, JSON.stringify(result.error));
  assert.equal(decodeOutcome(result.get("outcome")).returncode, 0, result.stderr);
  assert.equal(result.stdout, "no CUDA here\n");
  return result.requestId;
}

Deno.test("gpu gate: a burst of scripts on fresh workers defers the replacements' contexts", async () => {
  const server = await startServer({ ...SIM, workersPerGpu: 2, maxRequestsPerWorker: 1 });
  try {
    // Six at once on two seats: four wait while the first two seats are replaced.
    const ids = await Promise.all(Array.from({ length: 6 }, () => runPlainScript(server.url)));
    await server.pool.settled();
    const ready = server.events.filter((e) => e.event === "worker_ready");
    const startup = ready.filter((e) => e.generation === 1);
    const replacements = ready.filter((e) => (e.generation as number) > 1);
    assert.ok(startup.every((e) => e.context === "created"));
    const deferred = replacements.filter((e) => e.context === "deferred");
    assert.ok(deferred.length >= 1, JSON.stringify(replacements));
    // Only the replacements that created their context took the lease to initialize.
    const data: ServerStatusData = await (await fetch(`${server.url}/status/data`)).json();
    const holds = data.gpus[0].holds;
    assert.equal(
      holds.filter((h) => h.initialization).length,
      replacements.length - deferred.length,
      JSON.stringify(holds),
    );
    // A script's request on a worker without a context: no drain, no teardown under the lease.
    const routed = server.events.filter((e) => e.event === "request_routed");
    const onDeferred = ids.filter((id) => {
      const r = routed.find((e) => e.request_id === id)!;
      return deferred.some((d) => d.worker_id === r.worker_id && d.generation === r.generation);
    });
    assert.ok(onDeferred.length >= 1);
    for (const id of onDeferred) {
      assert.ok(!holds.some((h) => h.id === `teardown:${id}`), `${id}: ${JSON.stringify(holds)}`);
    }
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(
      metrics,
      new RegExp(`kcoral_workers_ready_total{context="deferred"} ${deferred.length}\n`),
    );
  } finally {
    await server.stop();
  }
});
