/**
 * The `profile` tool: `kcoral run ncu` or `kcoral run compute-sanitizer` on a sent application.
 * Returns the report file (the Nsight Compute report `capture.ncu-rep`, saved; the Compute
 * Sanitizer log, inline when small) and a short text summary: per kernel its launch shape and
 * headline metrics (read on the worker with `ncu --import`), or the sanitizer's error count and
 * first findings.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import type { Program, ResultValue } from "../../../client/mod.ts";
import { validateToolArguments } from "../../run/validators.ts";
import { runCall, type ToolExtra, ToolFailure } from "../call.ts";
import { CallFiles, type FetchedFile, fetchedFileSchema } from "../files.ts";
import {
  NCU_SUMMARY_KEY,
  NCU_SUMMARY_MODULE,
  type NcuKernel,
  parseNcuDetails,
  summarizeNcuKernels,
  summarizeSanitizerLog,
} from "../profile_summary.ts";
import { outputOf, outputShape, timingsOf, timingsSchema } from "../results.ts";
import { filesRoot, type McpSettings } from "../settings.ts";
import { executeToolRun, type ToolRun } from "../tool_run.ts";
import { exitShape, sendInputShape } from "./common.ts";

/** The Compute Sanitizer log `profile` asks for (relative to the remote working directory). */
export const SANITIZER_LOG = "compute-sanitizer.log";
/** The Nsight Compute report in the `outputs` folder. */
export const NCU_REPORT = "capture.ncu-rep";

/** The input of `profile`. */
export const profileInput = {
  tool: z.enum(["ncu", "compute-sanitizer"]).describe(
    "ncu: an Nsight Compute report; compute-sanitizer: memory and race checks",
  ),
  command: z.array(z.string()).min(1).describe(
    'the application and its arguments, run in the remote working directory, e.g. ["python", ' +
      '"main.py"] or ["./app"]',
  ),
  options: z.array(z.string()).default([]).describe(
    'profiler options, e.g. ["--set", "basic", "--launch-count", "1"] for ncu or ["--tool", ' +
      '"memcheck", "--error-exitcode", "1"] for compute-sanitizer (ncu: --export, --import, ' +
      "--mode, --config-file are managed; compute-sanitizer: --log-file is managed)",
  ),
  ...sendInputShape,
};

const _kernelSchema = z.object({
  id: z.string(),
  name: z.string(),
  grid: z.string(),
  block: z.string(),
  metrics: z.record(z.string(), z.string()),
});

/** The structured result of `profile`. */
export const profileOutput = {
  tool: z.enum(["ncu", "compute-sanitizer"]),
  ...exitShape,
  summary: z.string().describe("a short text summary of the report"),
  report: fetchedFileSchema.nullable().describe(
    "the report file: capture.ncu-rep (saved) or the sanitizer log; null when none was written",
  ),
  errors: z.number().int().nullable().describe(
    "compute-sanitizer: the ERROR SUMMARY count (null: no summary); ncu: null",
  ),
  kernels: z.array(_kernelSchema).describe("ncu: the profiled kernels; compute-sanitizer: []"),
  ...outputShape,
  timings: timingsSchema,
  files_directory: z.string().nullable().describe("where this call saved files, if it did"),
};

type _ProfileInput = z.infer<z.ZodObject<typeof profileInput>>;

/**
 * The native arguments of a `profile` call, checked as `kcoral run` checks them.
 *
 * @throws {ToolFailure} kind `invalid_input` for a managed or malformed option.
 *
 * @example
 * ```ts
 * import { profilerArguments } from "./profile.ts";
 *
 * const ncu = profilerArguments("ncu", ["--set", "basic"], ["python", "main.py"]);
 * if (ncu.join(" ") !== "--set basic -- python main.py") throw new Error(ncu.join(" "));
 * const cs = profilerArguments("compute-sanitizer", [], ["./app"]);
 * if (cs.join(" ") !== "--log-file compute-sanitizer.log ./app") throw new Error(cs.join(" "));
 * ```
 */
export function profilerArguments(
  tool: "ncu" | "compute-sanitizer",
  options: readonly string[],
  command: readonly string[],
): string[] {
  if (options.includes("--")) {
    throw new ToolFailure(
      "invalid_input",
      "options must not contain '--'; put the application in command",
    );
  }
  if (tool === "ncu") {
    const forwarded = [...options, "--", ...command];
    const invalid = validateToolArguments("ncu", forwarded);
    if (invalid !== undefined) throw new ToolFailure("invalid_input", invalid);
    return forwarded;
  }
  const managed = options.find((option) =>
    option === "--log-file" || option.startsWith("--log-file=")
  );
  if (managed !== undefined) {
    throw new ToolFailure(
      "invalid_input",
      `--log-file is managed by profile (the log comes back as the report): ${managed}`,
    );
  }
  return [...options, "--log-file", SANITIZER_LOG, ...command];
}

/**
 * Register `profile` on `server`.
 *
 * @example
 * ```ts ignore
 * registerProfile(server, settings);
 * ```
 */
export function registerProfile(server: McpServer, settings: McpSettings): void {
  server.registerTool(
    "profile",
    {
      title: "Profile with ncu or compute-sanitizer",
      description: "Run an application under Nsight Compute (ncu) or Compute Sanitizer on the " +
        "KCoral GPU server. Send the application with `send` (and/or inline Python `source`, " +
        "sent as main.py) and name it in `command`. Returns the report file (capture.ncu-rep is " +
        "saved locally; the sanitizer log is inline when small), a short summary (per kernel: " +
        "grid, block, duration, throughputs, occupancy; or the sanitizer's error count and first " +
        "findings), the exit code, output and timings.",
      inputSchema: profileInput,
      outputSchema: profileOutput,
      annotations: { openWorldHint: true },
    },
    (input: z.infer<z.ZodObject<typeof profileInput>>, extra: ToolExtra) =>
      runCall("profile", extra, async (call) => {
        const forwarded = profilerArguments(input.tool, input.options, input.command);
        const ncu = input.tool === "ncu";
        const run = await executeToolRun(
          {
            tool: input.tool,
            forwarded,
            env: input.env,
            fetch: ncu ? [] : [SANITIZER_LOG],
            returnOutputs: true,
            send: {
              send: input.send,
              ...(input.source === undefined ? {} : { source: input.source }),
            },
            timeoutSeconds: input.timeout_seconds,
            outputLimitBytes: input.output_limit_bytes,
            ...(ncu ? { extend: (program: Program) => _addNcuSummary(program, input.env) } : {}),
            tolerate: ["ncu_summary_run"],
          },
          settings,
          call,
        );
        const files = new CallFiles(filesRoot(settings), "profile", settings.inlineLimit);
        const reportName = ncu ? NCU_REPORT : SANITIZER_LOG;
        const reportFile = run.outputs?.files.get(reportName);
        const report: FetchedFile | null = reportFile === undefined
          ? null
          : await files.describe(reportName, reportFile, ncu);
        const summary = ncu ? _ncuSummary(run) : _sanitizerSummary(run, reportFile?.text());
        return {
          tool: input.tool,
          exit_code: run.outcome.returncode,
          missing: run.outcome.missing,
          summary: summary.text,
          report,
          errors: summary.errors,
          kernels: summary.kernels,
          ...outputOf(run.result),
          timings: timingsOf(run.result),
          files_directory: files.directory ?? null,
        };
      }, settings.log),
  );
}

function _addNcuSummary(program: Program, env: _ProfileInput["env"]): void {
  const module = program.upload({ kind: "module", source: NCU_SUMMARY_MODULE, id: "ncu_summary" });
  const summarize = program.getFunction({
    module,
    name: "summarize",
    cpuOnly: true,
    id: "ncu_summarize",
  });
  const value = program.run({ fn: summarize, args: [{ ...env }], id: "ncu_summary_run" });
  program.return_({ key: NCU_SUMMARY_KEY, value });
}

interface _Summary {
  text: string;
  errors: number | null;
  kernels: NcuKernel[];
}

function _ncuSummary(run: ToolRun): _Summary {
  const answer = run.result.has(NCU_SUMMARY_KEY) ? run.result.get(NCU_SUMMARY_KEY) : null;
  const field = (name: string): ResultValue | undefined =>
    answer instanceof Map ? answer.get(name) : undefined;
  const prof = `${run.result.stdout}\n${run.result.stderr}`.split("\n")
    .filter((line) => /^==(PROF|ERROR|WARNING)==/.test(line)).slice(0, 10).join("\n");
  if (run.extraFailure !== null) {
    return {
      text: `ncu --import failed: ${run.extraFailure}\n${prof}`.trim(),
      errors: null,
      kernels: [],
    };
  }
  if (field("returncode") === null || field("returncode") === undefined) {
    return { text: `no report was written\n${prof}`.trim(), errors: null, kernels: [] };
  }
  if (field("returncode") !== 0) {
    const stderr = String(field("stderr") ?? "").split("\n").slice(0, 10).join("\n");
    return {
      text: `ncu --import exited ${field("returncode")}: ${stderr}\n${prof}`.trim(),
      errors: null,
      kernels: [],
    };
  }
  const kernels = parseNcuDetails(String(field("stdout") ?? ""));
  return { text: summarizeNcuKernels(kernels), errors: null, kernels };
}

function _sanitizerSummary(run: ToolRun, log: string | undefined): _Summary {
  if (log === undefined) {
    const tail = run.result.stderr.split("\n").slice(-10).join("\n");
    return { text: `no sanitizer log was written\n${tail}`.trim(), errors: null, kernels: [] };
  }
  const summary = summarizeSanitizerLog(log);
  return { text: summary.text, errors: summary.errors, kernels: [] };
}
