/**
 * A routed deployment on a real GPU (run on the GPU machine; `bash tests/gpu/run_all.sh
 * router`): `kcoral router` and one GPU node (`kcoral server --router`, its supervisor, its
 * server, GPU 0) on loopback. Checks, each printed as PASS or FAIL:
 *
 * - a CUDA tensor round trip through the Router gives the same answer as the node directly;
 * - kernel times measured by CUDA events through the Router match those measured directly (the
 *   Router adds no work on the GPU machine while the kernel runs);
 * - `kcoral run python` through the Router sees the GPU;
 * - SIGTERM on the node while a GPU request runs: the request completes, the node exits 0.
 *
 * Prints the Router's URL as `ROUTER_URL=...` so that `tests/gpu/cli_gpu.sh` can be pointed
 * at it while the deployment is up: with `--hold-until FILE`, the deployment stays up (before
 * the SIGTERM check) until FILE exists, at most 10 minutes.
 *
 *   deno run -A tests/gpu/router_gpu.ts [--hold-until FILE]
 *
 * @module
 */
import { Client, Program, type Tensor } from "../../mod.ts";
import {
  freePort,
  KcoralProcess,
  QUICK_SUPERVISOR,
  startRouter,
  waitForCapacity,
} from "../_router.ts";

const holdIndex = Deno.args.indexOf("--hold-until");
const holdFile = holdIndex >= 0 ? Deno.args[holdIndex + 1] : undefined;
let failed = 0;

function check(name: string, ok: boolean, detail = ""): void {
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
  if (!ok) failed++;
}

const router = await startRouter();
const port = freePort();
const node = new KcoralProcess([
  "server",
  "--router",
  router.url,
  "--node-id",
  "gpu-node",
  "--device",
  "gpu",
  "--gpus",
  "0",
  "--workers-per-gpu",
  "2",
  "--port",
  String(port),
  "--log-dir",
  "",
  ...QUICK_SUPERVISOR,
]);
const direct = `http://127.0.0.1:${port}`;

try {
  await waitForCapacity(router.url, 2, 180_000);
  console.log(`ROUTER_URL=${router.url}`);
  await using routed = new Client(router.url);
  await using local = new Client(direct);

  // 1. A CUDA tensor round trip, routed and direct.
  const program = new Program();
  const mod = program.upload({
    kind: "module",
    source: [
      "import torch",
      "def gram(x):",
      "    assert x.is_cuda, x.device",
      "    return x @ x.T, torch.cuda.get_device_name()",
      "",
    ].join("\n"),
  });
  const values = new Float32Array(256 * 64).map((_, i) => (i % 17) - 8);
  const x = program.upload({ kind: "tensor", value: values, shape: [256, 64] });
  const out = program.run({ fn: program.getFunction({ module: mod, name: "gram" }), args: [x] });
  program.return_({ key: "out", value: out });
  const viaRouter = await routed.execute(program);
  const viaNode = await local.execute(program);
  const [a, nameA] = viaRouter.get<[Tensor, string]>("out");
  const [b] = viaNode.get<[Tensor, string]>("out");
  const same = a.data.length === 256 * 256 &&
    (a.data as Float32Array).every((v, i) => v === (b.data as Float32Array)[i]);
  check("CUDA tensor round trip through the Router equals direct", same, String(nameA));

  // 2. Kernel time by CUDA events, routed and direct, alternating.
  const timing = new Program();
  const timed = timing.upload({
    kind: "module",
    source: [
      "import torch",
      "def median_ms():",
      // The same matrix every time: a GEMM's power draw, and so its clock, follows its data.
      "    g = torch.Generator(device='cuda').manual_seed(0)",
      "    a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16, generator=g)",
      "    for _ in range(20): a @ a",
      "    times = []",
      "    for _ in range(200):",
      "        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)",
      "        s.record(); a @ a; e.record(); e.synchronize(); times.append(s.elapsed_time(e))",
      "    times.sort()",
      "    return times[len(times) // 2]",
      "",
    ].join("\n"),
  });
  timing.return_({
    key: "ms",
    value: timing.run({ fn: timing.getFunction({ module: timed, name: "median_ms" }), args: [] }),
  });
  const routedMs: number[] = [];
  const directMs: number[] = [];
  // Routed and direct take turns in ABBA order, so that neither keeps landing on the same one of
  // the node's two worker seats (a seat's context and placement move a GEMM by a few per cent).
  for (let i = 0; i < 12; i++) {
    const order = i % 2 === 0 ? [routed, local] : [local, routed];
    for (const client of order) {
      const ms = (await client.execute(timing)).get<number>("ms");
      (client === routed ? routedMs : directMs).push(ms);
    }
  }
  const median = (v: number[]) => [...v].sort((p, q) => p - q)[v.length >> 1];
  const ratio = median(routedMs) / median(directMs);
  check(
    "bf16 4096² matmul by CUDA events: routed / direct within 3 %",
    Math.abs(ratio - 1) <= 0.03,
    `routed ${median(routedMs).toFixed(4)} ms (${_range(routedMs)}), direct ` +
      `${median(directMs).toFixed(4)} ms (${_range(directMs)})`,
  );

  // 3. kcoral run python through the Router.
  const run = new KcoralProcess([
    "run",
    "python",
    "--",
    "-c",
    "import torch; print('routed on', torch.cuda.get_device_name(0))",
  ], { KCORAL_URL: router.url });
  const status = await run.status;
  const line = run.lines.find((l) => l.startsWith("routed on")) ?? "";
  check("kcoral run python through the Router sees the GPU", status.code === 0 && !!line, line);

  if (holdFile) {
    console.log(`holding the deployment until ${holdFile} exists`);
    for (let i = 0; i < 1200 && !_exists(holdFile); i++) {
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }

  // 4. SIGTERM on the node while a GPU request runs.
  const slow = new Program();
  const sleeper = slow.upload({
    kind: "module",
    source: [
      "import torch, time",
      "def spin():",
      "    a = torch.ones(1024, device='cuda')",
      "    time.sleep(3)",
      "    return float(a.sum())",
      "",
    ].join("\n"),
  });
  slow.return_({
    key: "v",
    value: slow.run({ fn: slow.getFunction({ module: sleeper, name: "spin" }), args: [] }),
  });
  const pending = routed.execute(slow);
  await new Promise((resolve) => setTimeout(resolve, 1000));
  node.kill("SIGTERM");
  const drained = await pending.then((r) => r.get<number>("v"), (e) => String(e));
  const exit = await node.status;
  check(
    "SIGTERM during a GPU request: it completes, the node exits 0",
    drained === 1024 && exit.code === 0,
    `result ${drained}, exit ${exit.code}`,
  );
} catch (error) {
  check("routed GPU deployment", false, String(error));
} finally {
  await node.stop();
  await router.stop();
}
console.log(`RESULT ${failed === 0 ? "PASS" : "FAIL"} (${failed} failed)`);
Deno.exit(failed === 0 ? 0 : 1);

function _exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** `min–max` of `values` in ms, for the printout. */
function _range(values: number[]): string {
  return `${Math.min(...values).toFixed(4)}–${Math.max(...values).toFixed(4)}`;
}
