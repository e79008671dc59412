/**
 * The program `kcoral run TOOL` sends (spec cli.md §2.2): an ordinary KCoral program whose
 * runner is uploaded Python source, so it runs on any KCoral server, upstream included.
 *
 * @module
 */

import { type ExecuteOptions, Program } from "../../client/mod.ts";
import type { RunArgs } from "./args.ts";
import type { ToolSources } from "./sources.ts";

/** Return key of the runner's `{"returncode", "missing"}` outcome. */
export const OUTCOME_KEY = "outcome";
/** Return key of the `outputs/` folder (only with `--out`). */
export const ARTIFACTS_KEY = "artifacts";

/** What {@linkcode buildToolProgram} needs from the command line. */
export type ToolProgramArgs = Pick<
  RunArgs,
  "forwarded" | "env" | "fetch" | "out" | "timeoutSeconds" | "outputLimitBytes"
>;

/** A program and the execute options it is sent with. */
export interface ToolProgram {
  /** The instructions and the inputs blob. */
  program: Program;
  /** `timeout_seconds` and `output_limit_bytes`, always both. */
  options: ExecuteOptions;
}

/**
 * Build the `kcoral run` program, instruction for instruction as upstream sends it:
 *
 * 1. upload module `tool_runner` (the runner source), 2. get_function `runner` (`run`),
 * 3. upload module `definition` (the tool source), 4. get_function `tool_run` (`run`),
 * 5. upload bytes `inputs` (the `--send` tar), 6. run `run`:
 *    `runner(inputs, tool_run, FORWARDED, ENV, FETCH)`, 7. return `outcome`, and with
 *    `--out` 8. return folder `artifacts` from `outputs` (after the outcome, so the exit
 *    status survives a failing folder return).
 *
 * @example
 * ```ts
 * import { buildToolProgram } from "./program.ts";
 * const { program, options } = buildToolProgram(
 *   { runner: "def run(*a): pass\n", definition: "def run(*a): pass\n" },
 *   new Uint8Array(1024),
 *   { forwarded: ["-c", "pass"], env: {}, fetch: [], timeoutSeconds: 300, outputLimitBytes: 1024 },
 * );
 * program.instructions.map((i) => i.id ?? i.key);
 * // ["tool_runner", "runner", "definition", "tool_run", "inputs", "run", "outcome"]
 * options; // { timeoutSeconds: 300, outputLimitBytes: 1024 }
 * ```
 */
export function buildToolProgram(
  sources: ToolSources,
  archive: Uint8Array,
  args: ToolProgramArgs,
): ToolProgram {
  const program = new Program();
  const runnerModule = program.upload({
    kind: "module",
    source: sources.runner,
    id: "tool_runner",
  });
  const runner = program.getFunction({ module: runnerModule, name: "run", id: "runner" });
  const definition = program.upload({
    kind: "module",
    source: sources.definition,
    id: "definition",
  });
  const toolRun = program.getFunction({ module: definition, name: "run", id: "tool_run" });
  const inputs = program.upload({ kind: "bytes", value: archive, id: "inputs" });
  const run = program.run({
    fn: runner,
    args: [inputs, toolRun, [...args.forwarded], { ...args.env }, [...args.fetch]],
    id: "run",
  });
  program.return_({ key: OUTCOME_KEY, value: run });
  if (args.out !== undefined) program.returnFolder({ key: ARTIFACTS_KEY, path: "outputs" });
  return {
    program,
    options: { timeoutSeconds: args.timeoutSeconds, outputLimitBytes: args.outputLimitBytes },
  };
}
