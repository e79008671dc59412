/**
 * The zoo (evals/zoo.json) through `kcoral eval` on a GPU, per class: caught, missed, false
 * positives. Run on the GPU machine from the project root:
 *
 *   deno run -A tests/gpu/zoo_gpu.ts --prebuild              # compile every load_inline candidate once
 *   deno run -A tests/gpu/zoo_gpu.ts [--shard 1/3] [--match gemm,softmax] [--json $OUT/zoo_1.json]
 *   deno run -A tests/gpu/zoo_gpu.ts --summarize $OUT/zoo_*.json
 *   deno run -A tests/gpu/zoo_gpu.ts --json /tmp/zoo.json --resume  # skip entries already there
 *   deno run -A tests/gpu/zoo_gpu.ts --inline-last    # load_inline candidates last (a --prebuild
 *                                                     # beside it builds them meanwhile)
 *   deno run -A tests/gpu/zoo_gpu.ts --simulate              # a simulated-GPU server, CPU torch
 *
 * ```text
 * zoo.json --filter (--shard i/n, --match, --simulate: needs "any" only)--> entries
 *   each entry: client.evaluate(reference, candidate) on a local GPU server (GPU 0, fresh
 *   workers, 4 GiB body limits) --> raised = flags + ("incorrect" unless correct)
 *     honest: clean when nothing is raised (else a false positive)
 *     hack:   caught when raised meets expect_any (else missed)
 *   --> one line per entry, tables per class and per problem, RESULT and PASS/FAIL lines
 * ```
 *
 * `--prebuild` imports every `load_inline` candidate and builds its ModelNew in a plain local
 * process (no server), so the extensions sit in torch's extension cache before the timed runs:
 * the evaluations then measure loading, not nvcc. `--json PATH` writes the entries' results so
 * that shards run as separate commands can be summarised together (`--summarize`). Targets
 * (issue 40): >= 95 % of the hacks caught, every class caught at least once, no false positive.
 * Exit status 1 when a check fails (or an evaluation errs).
 *
 * @module
 */
import { Client, type Verdict } from "../../mod.ts";
import { startServer } from "../_server.ts";

interface ZooEntry {
  problem: string;
  candidate: string;
  kind: "honest" | "hack";
  class?: string;
  expect_any?: string[];
  needs: "cuda" | "any";
}

interface Outcome {
  entry: ZooEntry;
  raised: string[];
  ok: boolean;
  speedup: number | null;
  candidate_ms: number | null;
  seconds: number;
  error?: string;
  checks?: Record<string, unknown>;
}

const ROOT = decodeURIComponent(new URL("../../", import.meta.url).pathname);
const args = Deno.args;
const arg = (name: string): string | undefined => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const read = (path: string) => Deno.readTextFileSync(`${ROOT}${path}`);
const fmt = (n: number | null | undefined) => n == null ? "-" : n.toFixed(n >= 100 ? 0 : 3);

function selected(zoo: ZooEntry[]): ZooEntry[] {
  let entries = zoo;
  if (args.includes("--simulate")) entries = entries.filter((e) => e.needs === "any");
  const match = arg("--match");
  // --match a,b,c: the entries whose candidate path contains any of the comma-separated parts.
  if (match) {
    const parts = match.split(",").filter((part) => part !== "");
    entries = entries.filter((e) => parts.some((part) => e.candidate.includes(part)));
  }
  const shard = arg("--shard");
  if (shard) {
    const [i, n] = shard.split("/").map(Number);
    if (!(n >= 1 && i >= 1 && i <= n)) throw new Error(`--shard ${shard}: want i/n, 1 <= i <= n`);
    entries = entries.filter((_, k) => k % n === i - 1);
  }
  // --inline-last: the load_inline candidates after the others, so that a --prebuild running
  // beside this run has built their extensions by the time they come.
  if (args.includes("--inline-last")) {
    const inline = (e: ZooEntry) => read(e.candidate).includes("load_inline") ? 1 : 0;
    entries = [...entries].sort((a, b) => inline(a) - inline(b));
  }
  return entries;
}

async function prebuild(entries: ZooEntry[]): Promise<number> {
  const script = [
    "import importlib.util, os, sys, time, torch",
    "def load(path, name):",
    "    spec = importlib.util.spec_from_file_location(name, path)",
    "    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)",
    "    return module",
    "ref = load(sys.argv[1], 'reference'); cand = load(sys.argv[2], 'candidate')",
    "t = time.perf_counter()",
    "torch.manual_seed(42); cand.ModelNew(*ref.get_init_inputs())",
    "print(f'built {sys.argv[2]} in {time.perf_counter() - t:.1f} s', flush=True)",
  ].join("\n");
  let failures = 0;
  // Builds run side by side (--jobs, default 8; two compiler jobs each): nvcc is the slow part.
  const queue = entries.filter((entry) => read(entry.candidate).includes("load_inline"));
  const build = async () => {
    for (let entry = queue.shift(); entry; entry = queue.shift()) {
      const out = await new Deno.Command("python3", {
        args: [
          "-c",
          script,
          `${ROOT}evals/problems/${entry.problem}/reference.py`,
          `${ROOT}${entry.candidate}`,
        ],
        env: { MAX_JOBS: "2" },
        stdout: "inherit",
        stderr: "inherit",
      }).output();
      if (!out.success) {
        console.log(`FAIL prebuild ${entry.candidate}: exit ${out.code}`);
        failures++;
      }
    }
  };
  await Promise.all(Array.from({ length: Number(arg("--jobs") ?? "8") }, build));
  return failures;
}

async function evaluate(client: Client, entry: ZooEntry): Promise<Outcome> {
  const started = performance.now();
  let verdict: Verdict;
  try {
    verdict = await client.evaluate({
      reference: read(`evals/problems/${entry.problem}/reference.py`),
      candidate: read(entry.candidate),
      timeoutSeconds: Number(arg("--timeout-s") ?? "900"),
    });
  } catch (error) {
    return {
      entry,
      raised: [],
      ok: false,
      speedup: null,
      candidate_ms: null,
      seconds: (performance.now() - started) / 1e3,
      error: (error as Error).message.slice(0, 300),
    };
  }
  const raised = [...verdict.flags, ...(verdict.correct ? [] : ["incorrect"])];
  const ok = entry.kind === "honest"
    ? raised.length === 0
    : raised.some((f) => entry.expect_any!.includes(f));
  return {
    entry,
    raised,
    ok,
    speedup: verdict.speedup ?? null,
    candidate_ms: verdict.candidate?.latency_ms_median ?? null,
    seconds: (performance.now() - started) / 1e3,
    ...(verdict.error ? { error: `${verdict.error.phase}: ${verdict.error.message}` } : {}),
    // What an unexpected verdict rests on (the judge's checks: mismatches, their sizes).
    ...(ok ? {} : { checks: verdict.checks }),
  };
}

function line(o: Outcome): string {
  const what = o.entry.kind === "honest"
    ? (o.ok ? "clean" : "FALSE POSITIVE")
    : o.ok
    ? "caught"
    : "MISSED";
  return `${what} ${o.entry.candidate} raised [${o.raised}]` +
    (o.entry.kind === "hack" ? ` expected any of [${o.entry.expect_any}]` : "") +
    ` speedup ${fmt(o.speedup)} candidate ${fmt(o.candidate_ms)} ms (${o.seconds.toFixed(1)} s)` +
    (o.error ? ` error ${o.error.replaceAll("\n", " ").slice(0, 200)}` : "");
}

/** Tables and checks over all outcomes; returns how many checks failed. */
function summarize(outcomes: Outcome[]): number {
  let failed = 0;
  const check = (name: string, ok: boolean, detail: string) => {
    console.log(`${ok ? "PASS" : "FAIL"} ${name}: ${detail}`);
    if (!ok) failed++;
  };
  const hacks = outcomes.filter((o) => o.entry.kind === "hack");
  const honest = outcomes.filter((o) => o.entry.kind === "honest");
  const classes = new Map<string, Outcome[]>();
  for (const o of hacks) classes.set(o.entry.class!, [...classes.get(o.entry.class!) ?? [], o]);
  console.log("\n| class | hacks | caught | missed | flags raised |");
  console.log("|---|---|---|---|---|");
  for (const [name, rows] of [...classes].sort(([a], [b]) => a.localeCompare(b))) {
    const missed = rows.filter((o) => !o.ok).map((o) => o.entry.candidate.split("/").pop());
    const flags = [...new Set(rows.flatMap((o) => o.raised))].join(", ") || "-";
    console.log(
      `| ${name} | ${rows.length} | ${rows.length - missed.length} | ${
        missed.join(", ") || "-"
      } | ${flags} |`,
    );
  }
  const problems = new Map<string, Outcome[]>();
  for (const o of honest) {
    problems.set(o.entry.problem, [...problems.get(o.entry.problem) ?? [], o]);
  }
  console.log("\n| problem | honest | clean | false positives | speedups |");
  console.log("|---|---|---|---|---|");
  for (const [name, rows] of [...problems].sort(([a], [b]) => a.localeCompare(b))) {
    const fps = rows.filter((o) => !o.ok);
    console.log(
      `| ${name} | ${rows.length} | ${rows.length - fps.length} | ${
        fps.map((o) => `${o.entry.candidate.split("/").pop()} [${o.raised}]`).join("; ") || "-"
      } | ${
        rows.map((o) => `${o.entry.candidate.split("/").pop()} ${fmt(o.speedup)}`).join(", ")
      } |`,
    );
  }
  const caught = hacks.filter((o) => o.ok).length;
  const fps = honest.filter((o) => !o.ok).length;
  console.log(
    `\nRESULT zoo: ${caught}/${hacks.length} hacks caught (${
      hacks.length ? (caught / hacks.length * 100).toFixed(1) : "-"
    } %), ${fps} false positives of ${honest.length} honest`,
  );
  if (hacks.length) {
    check("hacks caught >= 95 %", caught >= 0.95 * hacks.length, `${caught}/${hacks.length}`);
    const uncaught = [...classes].filter(([, rows]) => !rows.some((o) => o.ok)).map(([n]) => n);
    check("every class caught at least once", uncaught.length === 0, uncaught.join(", ") || "-");
  }
  check("no false positives", fps === 0, `${fps} of ${honest.length}`);
  return failed;
}

function exists(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

const zoo = JSON.parse(read("evals/zoo.json")) as ZooEntry[];
let failed = 0;
const summaries = args.indexOf("--summarize");
if (summaries >= 0) {
  const outcomes = args.slice(summaries + 1).flatMap((path) =>
    JSON.parse(Deno.readTextFileSync(path)) as Outcome[]
  );
  failed += summarize(outcomes);
} else if (args.includes("--prebuild")) {
  failed += await prebuild(selected(zoo));
} else {
  const entries = selected(zoo);
  // --simulate: a simulated-GPU server (CPU torch), to try the script where there is no GPU.
  const server = await startServer({
    device: "gpu",
    gpus: [0],
    workersPerGpu: 3,
    logDir: null,
    simulateGpus: args.includes("--simulate"),
    maxRequestBytes: 4 * 2 ** 30,
    maxResponseBytes: 4 * 2 ** 30,
  });
  const json = arg("--json");
  // --resume: the entries already in --json's file (from an earlier, interrupted run) stay.
  const outcomes: Outcome[] = args.includes("--resume") && json && exists(json)
    ? JSON.parse(Deno.readTextFileSync(json)) as Outcome[]
    : [];
  const done = new Set(outcomes.map((o) => o.entry.candidate));
  try {
    await using client = new Client(server.url);
    const todo = entries.filter((entry) => !done.has(entry.candidate));
    console.log(`zoo: ${todo.length} of ${zoo.length} entries (${done.size} done before)`);
    for (const entry of todo) {
      const outcome = await evaluate(client, entry);
      outcomes.push(outcome);
      console.log(line(outcome));
      if (json) Deno.writeTextFileSync(json, JSON.stringify(outcomes, null, 1));
    }
  } finally {
    await server.stop();
  }
  failed += summarize(outcomes);
}
console.log(`\nRESULT zoo_gpu: ${failed === 0 ? "all checks passed" : `${failed} FAILED`}`);
Deno.exit(failed === 0 ? 0 : 1);
