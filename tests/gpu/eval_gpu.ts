/**
 * kcoral eval on a real GPU (issue 40), run on the GPU machine from the project root:
 *
 *   deno run -A tests/gpu/eval_gpu.ts [--runs 7] [--sandbox bubblewrap]
 *     [--only honest,ttv,hacks,agreement,zoo]
 *
 * Starts a GPU server (GPU 0, three fresh workers, 4 GiB body limits) and prints, each with RESULT/PASS/FAIL lines:
 * 1. honest = reference: every evals/problems/<p>/reference.py judged against itself (and its
 *    honest/torch_same.py when present): correct, unflagged, speedup CI containing 1.00;
 * 2. time to verdict per phase for gemm_fp32 (4096², fp32) with the reference's own code:
 *    median/min/max over --runs, target total_excluding_compile <= 2000 ms p50;
 * 3. two GPU-only hacks of our own (work left on a side stream; a persisting-L2 carve-out):
 *    caught by stream_escape/timer_escape/incorrect and persisting_l2;
 * 4. agreement: the judged candidate median against the same timing in a plain local process;
 * 5. the zoo (evals/zoo.json, when it exists): caught / missed / false positives per class.
 * `--simulate` runs it on a simulated-GPU server (CPU torch) to try the script without a GPU.
 * Exit status 1 when a PASS/FAIL check fails (the time-to-verdict target is reported, not
 * enforced).
 *
 * @module
 */
import { Client, type Verdict } from "../../mod.ts";
import { startServer } from "../_server.ts";

const arg = (name: string, fallback: string) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : fallback;
};
const ROOT = decodeURIComponent(new URL("../../", import.meta.url).pathname);
const runs = Number(arg("--runs", "7"));
// --only a,b: those parts only (comma-separated); all of them when absent.
const only = new Set(arg("--only", "").split(",").filter((part) => part !== ""));
const want = (part: string) => only.size === 0 || only.has(part);
const sandbox = arg("--sandbox", "none") as "none" | "bubblewrap";
let failed = 0;

function check(name: string, ok: boolean, detail: string): void {
  console.log(`${ok ? "PASS" : "FAIL"} ${name}: ${detail}`);
  if (!ok) failed++;
}

function problems(): string[] {
  const names: string[] = [];
  for (const entry of Deno.readDirSync(`${ROOT}evals/problems`)) {
    if (entry.isDirectory) names.push(entry.name);
  }
  return names.sort();
}

const read = (path: string) => Deno.readTextFileSync(`${ROOT}${path}`);
const exists = (path: string) => {
  try {
    return Deno.statSync(`${ROOT}${path}`).isFile;
  } catch {
    return false;
  }
};

const SIDE_STREAM = `
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, a, b):
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(50_000_000)
            torch.matmul(a, b, out=out)
        return out
`;

const PERSISTING_L2 = `
import ctypes
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.driver = ctypes.CDLL("libcuda.so.1")

    def forward(self, a, b):
        size = ctypes.c_size_t(8 << 20)
        self.driver.cuCtxSetLimit(ctypes.c_int(0x06), size)  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
        return torch.matmul(a, b)
`;

// --simulate: a simulated-GPU server (CPU torch), to try this script where there is no GPU.
const server = await startServer({
  device: "gpu",
  gpus: [0],
  workersPerGpu: 3,
  sandbox,
  logDir: null,
  simulateGpus: Deno.args.includes("--simulate"),
  // The 4096² GEMM's bundles: inputs 5 x 128 MiB, outputs 5 x 64 MiB (docs/eval.md, limits).
  maxRequestBytes: 4 * 2 ** 30,
  maxResponseBytes: 4 * 2 ** 30,
});
await using client = new Client(server.url);
const fmt = (n: number | null | undefined) => n == null ? "-" : n.toFixed(n >= 100 ? 0 : 3);
try {
  const health = await client.health() as unknown as { target: Record<string, string> };
  console.log(`server: GPU 0, target ${JSON.stringify(health.target)}, sandbox ${sandbox}`);

  if (want("honest")) {
    console.log("\n## honest = reference (speedup 1.00 within the CI)\n");
    console.log(
      "| problem | candidate | correct | flags | speedup | 95 % CI | sampling CI | " +
        "bracket drift | timing |",
    );
    console.log("|---|---|---|---|---|---|---|---|---|");
    for (const problem of problems()) {
      const reference = read(`evals/problems/${problem}/reference.py`);
      const candidates = [["reference.py", reference]];
      const same = `evals/problems/${problem}/honest/torch_same.py`;
      if (exists(same)) candidates.push(["honest/torch_same.py", read(same)]);
      for (const [name, candidate] of candidates) {
        const v = await client.evaluate({ reference, candidate });
        const ci = v.speedup_ci95;
        const within = ci !== null && ci[0] <= 1 && 1 <= ci[1];
        const bracket = v.reference_bracket;
        const sampling = bracket?.speedup_ci95_sampling;
        const drift = typeof bracket?.drift === "number"
          ? `${(bracket.drift * 100).toFixed(2)} %`
          : bracket?.reason ?? "-";
        console.log(
          `| ${problem} | ${name} | ${v.correct} | ${v.flags.join(", ") || "-"} | ` +
            `${fmt(v.speedup)} | ${ci ? `${fmt(ci[0])}-${fmt(ci[1])}` : "-"} | ` +
            `${sampling ? `${fmt(sampling[0])}-${fmt(sampling[1])}` : "-"} | ${drift} | ` +
            `${v.candidate?.timing ?? "-"} |`,
        );
        check(
          `honest ${problem}/${name}`,
          v.correct && v.flags.length === 0 && within,
          `correct ${v.correct}, flags [${v.flags}], speedup ${fmt(v.speedup)} CI ${ci}`,
        );
      }
    }
  }

  if (want("ttv") && exists("evals/problems/gemm_fp32/reference.py")) {
    console.log("\n## time to verdict, gemm_fp32 4096^2, the reference's own code\n");
    const reference = read("evals/problems/gemm_fp32/reference.py");
    const phases: Record<string, number[]> = {};
    for (let i = 0; i <= runs; i++) {
      const v = await client.evaluate({ reference, candidate: reference });
      if (i === 0) continue;
      for (const [k, ms] of Object.entries(v.phases_ms)) (phases[k] ??= []).push(ms);
    }
    console.log("| phase (ms) | median | min | max |");
    console.log("|---|---|---|---|");
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
    for (const [k, xs] of Object.entries(phases)) {
      console.log(
        `| ${k} | ${fmt(median(xs))} | ${fmt(Math.min(...xs))} | ${fmt(Math.max(...xs))} |`,
      );
    }
    const p50 = median(phases.total_excluding_compile);
    console.log(
      `RESULT time to verdict (compile excluded) p50 ${fmt(p50)} ms, target <= 2000 ms: ` +
        (p50 <= 2000 ? "met" : "MISSED"),
    );
  }

  if (want("hacks") && exists("evals/problems/gemm_fp32/reference.py")) {
    console.log("\n## GPU-only hacks of our own\n");
    const reference = read("evals/problems/gemm_fp32/reference.py");
    const side = await client.evaluate({ reference, candidate: SIDE_STREAM });
    const raised = [...side.flags, ...(side.correct ? [] : ["incorrect"])];
    check(
      "side stream",
      raised.some((f) => ["stream_escape", "timer_escape", "incorrect"].includes(f)),
      `raised [${raised}]`,
    );
    const l2 = await client.evaluate({ reference, candidate: PERSISTING_L2 });
    check("persisting L2 carve-out", l2.flags.includes("persisting_l2"), `raised [${l2.flags}]`);
  }

  if (want("agreement") && exists("evals/problems/gemm_fp32/reference.py")) {
    console.log("\n## agreement with a local process (same timing, same inputs' sizes)\n");
    const reference = read("evals/problems/gemm_fp32/reference.py");
    const v = await client.evaluate({ reference, candidate: reference });
    const script = [
      "import json, sys, torch",
      `sys.path.insert(0, ${JSON.stringify(`${ROOT}runtime_py`)})`,
      "from kcoral_runtime import eval_worker as w",
      "from kcoral_runtime.eval_timing import Rotation, time_model",
      `ref = w.load_source(open(${
        JSON.stringify(`${ROOT}evals/problems/gemm_fp32/reference.py`)
      }).read(), 'reference')`,
      "sets = []",
      "for s in (1, 2, 3):",
      "    torch.manual_seed(s); sets.append(w._to_device(list(ref.get_inputs()), 'cuda'))",
      "with torch.no_grad():",
      "    m = w._build_model(ref.Model, list(ref.get_init_inputs()), 42, 'cuda')",
      "    print(json.dumps(time_model('local', Rotation(m, sets), w.timing_settings(None, 'cuda'), 'cuda')['latency_ms_median']))",
    ].join("\n");
    const out = await new Deno.Command("python3", {
      args: ["-c", script],
      cwd: await Deno.makeTempDir(),
      stdout: "piped",
      stderr: "inherit",
    }).output();
    const local = Number(new TextDecoder().decode(out.stdout).trim());
    const judged = v.candidate!.latency_ms_median;
    const diff = Math.abs(judged - local) / local * 100;
    console.log(
      `RESULT judged median ${fmt(judged)} ms, local process ${fmt(local)} ms, ${
        diff.toFixed(2)
      } %`,
    );
    check("agreement within 0.5 %", diff <= 0.5, `${diff.toFixed(2)} %`);
  }

  if (want("zoo") && exists("evals/zoo.json")) {
    console.log("\n## the zoo: caught / missed / false positives\n");
    const zoo = JSON.parse(read("evals/zoo.json")) as {
      problem: string;
      candidate: string;
      kind: string;
      class?: string;
      expect_any?: string[];
    }[];
    const byClass = new Map<string, { caught: number; missed: string[]; total: number }>();
    const falsePositives: string[] = [];
    let honest = 0;
    for (const entry of zoo) {
      let v: Verdict;
      try {
        v = await client.evaluate({
          reference: read(`evals/problems/${entry.problem}/reference.py`),
          candidate: read(entry.candidate),
        });
      } catch (error) {
        console.log(`ERROR ${entry.candidate}: ${(error as Error).message}`);
        failed++;
        continue;
      }
      const raised = [...v.flags, ...(v.correct ? [] : ["incorrect"])];
      console.log(`${entry.kind} ${entry.candidate}: [${raised}]`);
      if (entry.kind === "honest") {
        honest++;
        if (raised.length > 0) falsePositives.push(`${entry.candidate} [${raised}]`);
        continue;
      }
      const row = byClass.get(entry.class!) ?? { caught: 0, missed: [], total: 0 };
      row.total++;
      if (raised.some((f) => entry.expect_any!.includes(f))) row.caught++;
      else row.missed.push(`${entry.candidate} [${raised}]`);
      byClass.set(entry.class!, row);
    }
    console.log("\n| class | hacks | caught | missed |");
    console.log("|---|---|---|---|");
    let caught = 0, total = 0;
    for (const [name, row] of [...byClass].sort()) {
      caught += row.caught;
      total += row.total;
      console.log(`| ${name} | ${row.total} | ${row.caught} | ${row.missed.join("; ") || "-"} |`);
    }
    console.log(
      `RESULT zoo: ${caught}/${total} hacks caught (${(caught / total * 100).toFixed(1)} %), ` +
        `${falsePositives.length} false positives of ${honest} honest`,
    );
    for (const fp of falsePositives) console.log(`false positive: ${fp}`);
    check("zoo caught >= 95 %", caught >= 0.95 * total, `${caught}/${total}`);
    check("zoo every class caught once", [...byClass.values()].every((r) => r.caught > 0), "");
    check("zoo no false positives", falsePositives.length === 0, `${falsePositives.length}`);
  }
} finally {
  await server.stop();
}
console.log(`\nRESULT eval_gpu: ${failed === 0 ? "all checks passed" : `${failed} FAILED`}`);
Deno.exit(failed === 0 ? 0 : 1);
