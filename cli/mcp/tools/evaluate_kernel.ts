/**
 * The `evaluate_kernel` tool: `kcoral eval` for agents. Judges a candidate (KernelBench format:
 * `class ModelNew`) against a reference (`class Model`, `get_inputs`, `get_init_inputs`) with
 * split trust (docs/eval.md): correctness on new secret inputs, the reward-hack checks and their
 * flags, both models timed. Returns the verdict object `Client.evaluate` gives.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { resolve } from "node:path";
import { z } from "zod";
import {
  Client,
  DEFAULT_TIMING_SETS,
  type EvaluateOptions,
  VERDICT_FLAGS,
} from "../../../client/mod.ts";
import { readSendFiles } from "../../eval_files.ts";
import { evaluateTiming } from "../../eval_timing.ts";
import { type CallContext, runCall, type ToolExtra, ToolFailure } from "../call.ts";
import { checkSendPath } from "../local_files.ts";
import type { McpSettings } from "../settings.ts";

/** The input of `evaluate_kernel`. */
export const evaluateKernelInput = {
  reference: z.string().optional().describe(
    "the reference file's source: class Model, get_inputs(), get_init_inputs() (or reference_path)",
  ),
  reference_path: z.string().min(1).optional().describe(
    "a local reference file, relative to the directory kcoral mcp runs in",
  ),
  candidate: z.string().optional().describe(
    "the candidate file's source: class ModelNew with Model's constructor arguments (or " +
      "candidate_path)",
  ),
  candidate_path: z.string().min(1).optional().describe("a local candidate file"),
  seeds: z.number().int().min(3).max(64).default(3).describe(
    "correctness input sets, each from a new secret seed",
  ),
  timing_sets: z.number().int().min(1).max(64).default(DEFAULT_TIMING_SETS).describe(
    "separate timing input sets, in a new random order every round",
  ),
  atol: z.number().nonnegative().optional().describe(
    "absolute tolerance over the dtype's default (KernelBench's: 1e-4 float32, 1e-2 fp16/bf16)",
  ),
  rtol: z.number().nonnegative().optional().describe("relative tolerance over the default"),
  determinism: z.enum(["auto", "on", "off"]).default("auto").describe(
    "require identical outputs from identical inputs (auto: unless the problem says " +
      "DETERMINISTIC = False)",
  ),
  excessive_speedup: z.number().gt(1).default(10).describe("flag speedups above this"),
  warmup: z.number().int().nonnegative().optional().describe(
    "untimed calls before timing (GPU default 10, CPU 2)",
  ),
  repeat: z.number().int().positive().optional().describe(
    "timed calls: a fixed count unless adaptive is true, then the round size",
  ),
  adaptive: z.boolean().optional().describe(
    "GPU: time in rounds until the median's 95 % CI is within 0.5 % or 1 s (the default unless " +
      "repeat is given)",
  ),
  bracket: z.boolean().default(true).describe(
    "also time the reference in the candidate's worker before the candidate loads, so that " +
      "speedup_ci95 spans the difference between workers, not sampling noise only",
  ),
  send: z.array(z.string().min(1)).default([]).describe(
    "local files or directories every step's worker gets (a directory keeps its name)",
  ),
  inputs_url: z.string().optional().describe(
    "generate the inputs on this server (default: the compile server, if kcoral mcp has one)",
  ),
  timeout_seconds: z.number().positive().optional().describe("each step's deadline"),
};

const _timing = z.record(z.string(), z.unknown()).nullable();

/** The structured result of `evaluate_kernel`: the verdict. */
export const evaluateKernelOutput = {
  correct: z.boolean().describe("every correctness set matched the reference within tolerance"),
  flags: z.array(z.enum(VERDICT_FLAGS)).describe("reward-hack and trust flags; [] when clean"),
  device: z.enum(["cuda", "cpu"]),
  speedup: z.number().nullable().describe("reference median / candidate median"),
  speedup_ci95: z.array(z.number()).nullable(),
  reference_bracket: z.record(z.string(), z.unknown()).optional().describe(
    "the reference timed in the candidate's worker too: its median, drift from the judge's " +
      "and the speedup against it",
  ),
  reference: _timing.describe("the reference's timing"),
  candidate: _timing.describe("the candidate's timing"),
  receipt: z.record(z.string(), z.unknown()).nullable(),
  checks: z.record(z.string(), z.unknown()).describe("the evidence behind correct and each flag"),
  phases_ms: z.record(z.string(), z.number()).describe("where the time to the verdict went"),
  worker_phases_ms: z.record(z.string(), z.number().nullable()),
  seeds: z.object({ correctness: z.number().int(), timing: z.number().int() }),
  request_ids: z.object({
    inputs: z.string(),
    candidate: z.string().nullable(),
    judge: z.string(),
  }),
  error: z.object({
    phase: z.string(),
    type: z.string(),
    message: z.string(),
    traceback: z.string(),
  }).optional().describe("why the candidate failed to load, raised or crashed"),
};

type _Input = z.infer<z.ZodObject<typeof evaluateKernelInput>>;

/**
 * Register `evaluate_kernel` on `server`.
 *
 * @example
 * ```ts ignore
 * registerEvaluateKernel(server, settings);
 * ```
 */
export function registerEvaluateKernel(server: McpServer, settings: McpSettings): void {
  server.registerTool(
    "evaluate_kernel",
    {
      title: "Evaluate a kernel against a reference",
      description: "Judge a candidate kernel file (KernelBench format: class ModelNew) against a " +
        "reference file (class Model, get_inputs, get_init_inputs): correctness on new secret " +
        "inputs (at least 3 sets) in a worker that never runs the candidate, reward-hack " +
        "checks (inputs modified, nondeterminism, timed outputs re-checked, stream escapes, " +
        "non-plain outputs, excessive or impossible speedups) and both models timed. Returns " +
        "the verdict: correct, flags, speedup with its 95 % CI, timings, per-phase times.",
      inputSchema: evaluateKernelInput,
      outputSchema: evaluateKernelOutput,
      annotations: { openWorldHint: true },
    },
    (input: _Input, extra: ToolExtra) =>
      runCall("evaluate_kernel", extra, (call) => _evaluate(input, settings, call), settings.log),
  );
}

async function _source(
  text: string | undefined,
  path: string | undefined,
  what: string,
  cwd: string,
) {
  if ((text === undefined) === (path === undefined)) {
    throw new ToolFailure("invalid_input", `give exactly one of ${what} or ${what}_path`);
  }
  if (text !== undefined) return text;
  try {
    return await Deno.readTextFile(resolve(cwd, path!));
  } catch (error) {
    throw new ToolFailure(
      "local_io",
      `cannot read ${what}_path ${path}: ${(error as Error).message}`,
    );
  }
}

async function _evaluate(input: _Input, settings: McpSettings, call: CallContext) {
  // Only files under the directories kcoral mcp may send from (cli/mcp/local_files.ts).
  if (input.reference_path !== undefined) {
    await checkSendPath(settings, input.reference_path, "reference_path");
  }
  if (input.candidate_path !== undefined) {
    await checkSendPath(settings, input.candidate_path, "candidate_path");
  }
  for (const path of input.send) await checkSendPath(settings, path, "send");
  const reference = await _source(input.reference, input.reference_path, "reference", settings.cwd);
  const candidate = await _source(input.candidate, input.candidate_path, "candidate", settings.cwd);
  let files;
  try {
    files = await readSendFiles(input.send, settings.cwd);
  } catch (error) {
    throw new ToolFailure("local_io", (error as Error).message);
  }
  const inputsUrl = input.inputs_url ?? settings.compileUrl;
  await using client = new Client(settings.url, settings.client);
  await using inputsClient = inputsUrl ? new Client(inputsUrl, settings.client) : null;
  const tolerance: EvaluateOptions["tolerance"] = {};
  if (input.atol !== undefined) tolerance.atol = input.atol;
  if (input.rtol !== undefined) tolerance.rtol = input.rtol;
  const steps = {
    inputs: "generating secret inputs",
    candidate: "running the candidate",
    judge: "judging",
  };
  const verdict = await client.evaluate({
    reference,
    candidate,
    seeds: input.seeds,
    timingSets: input.timing_sets,
    tolerance,
    determinism: input.determinism,
    excessiveSpeedup: input.excessive_speedup,
    timing: evaluateTiming(input),
    bracket: input.bracket,
    files,
    ...(inputsClient === null ? {} : { inputsClient }),
    ...(input.timeout_seconds === undefined ? {} : { timeoutSeconds: input.timeout_seconds }),
    signal: call.signal,
    onStep: (step) => call.progress.phase(steps[step]),
  });
  return verdict as unknown as Record<string, unknown>;
}
