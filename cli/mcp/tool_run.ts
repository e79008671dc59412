/**
 * Running one `kcoral run` tool for `run_python` and `profile`: the same program `kcoral run`
 * sends (`cli/run/program.ts`: the uploaded runner, the tool's definition, the inputs tar,
 * `--fetch` paths and the `outputs` folder), sent with the call's abort signal and progress.
 *
 * @module
 */
import { Client, type Program, type ProgramResult, ReturnedFolder } from "../../client/mod.ts";
import { decodeOutcome, type ToolOutcome } from "../run/outcome.ts";
import { ARTIFACTS_KEY, buildToolProgram, OUTCOME_KEY } from "../run/program.ts";
import { readToolSources } from "../run/sources.ts";
import type { ToolName } from "../run/tools.ts";
import { type CallContext, remoteFailure, ToolFailure } from "./call.ts";
import { checkEnvironment, packSendSpec, type SendSpec } from "./inputs.ts";
import { checkSendPath } from "./local_files.ts";
import type { McpSettings } from "./settings.ts";

/** One tool run. */
export interface ToolRunSpec {
  /** The `kcoral run` tool. */
  tool: ToolName;
  /** Native arguments (what `kcoral run TOOL` takes after `--`). */
  forwarded: string[];
  /** Remote environment overrides. */
  env: Record<string, string>;
  /** Paths to bring back, relative to the remote working directory (`--fetch`). */
  fetch: string[];
  /** Whether to return the `outputs` folder (with `fetch`, or a profiler's report). */
  returnOutputs: boolean;
  /** What to send. */
  send: SendSpec;
  /** Server-side execution limit in seconds. */
  timeoutSeconds: number;
  /** Captured output limit per stream. */
  outputLimitBytes: number;
  /** Adds instructions after the tool's (e.g. a report summary). */
  extend?: (program: Program) => void;
  /**
   * Ids of added instructions whose failure does not fail the run (the tool's own outcome
   * came back before them); such a failure is {@linkcode ToolRun.extraFailure}.
   */
  tolerate?: readonly string[];
}

/** A completed tool run. */
export interface ToolRun {
  /** The whole result (timings, output, extra returns). */
  result: ProgramResult;
  /** The runner's outcome: exit code (negative: killed by that signal) and missing outputs. */
  outcome: ToolOutcome;
  /** The `outputs` folder, when asked for and returned. */
  outputs: ReturnedFolder | null;
  /** The failure of a tolerated added instruction, `kind: message`; null when none failed. */
  extraFailure: string | null;
}

/**
 * Send `spec` to the server of `settings` and wait for it.
 *
 * @throws {ToolFailure} when the program did not complete (the server's error kind and
 * message), and the client's errors for transport, HTTP and protocol failures.
 *
 * @example
 * ```ts ignore
 * const run = await executeToolRun({ tool: "python", forwarded: ["main.py"], env: {}, fetch: [],
 *   returnOutputs: false, send: { source: "print(1)", send: [] }, timeoutSeconds: 60,
 *   outputLimitBytes: 65536 }, settings, call);
 * ```
 */
export async function executeToolRun(
  spec: ToolRunSpec,
  settings: McpSettings,
  call: CallContext,
): Promise<ToolRun> {
  const env = checkEnvironment(spec.env);
  for (const path of spec.send.send) await checkSendPath(settings, path, "send");
  const archive = await packSendSpec(spec.send, settings.cwd);
  const sources = await readToolSources(spec.tool);
  const { program, options } = buildToolProgram(sources, archive, {
    forwarded: spec.forwarded,
    env,
    fetch: spec.fetch,
    ...(spec.returnOutputs ? { out: "outputs" } : {}),
    timeoutSeconds: spec.timeoutSeconds,
    outputLimitBytes: spec.outputLimitBytes,
  });
  spec.extend?.(program);
  await using client = new Client(settings.url, settings.client);
  call.progress.phase(`running ${spec.tool} on ${settings.url}`);
  const result = await client.execute(program, {
    ...options,
    signal: call.signal,
    onProgress: (p) => call.progress.transfer(p),
  });
  const failedId = result.error?.instructionId ?? null;
  const tolerated = !result.completed && failedId !== null &&
    (spec.tolerate ?? []).includes(failedId) && result.has(OUTCOME_KEY);
  if (!result.completed && !tolerated) throw remoteFailure(result, `${spec.tool}: `);
  const extraFailure = tolerated ? `${result.error!.kind}: ${result.error!.message}` : null;
  const outcome = decodeOutcome(result.has(OUTCOME_KEY) ? result.get(OUTCOME_KEY) : undefined);
  let outputs: ReturnedFolder | null = null;
  if (spec.returnOutputs && result.has(ARTIFACTS_KEY)) {
    const folder = result.get(ARTIFACTS_KEY);
    if (!(folder instanceof ReturnedFolder)) {
      throw new ToolFailure("protocol", "the outputs folder came back as something else");
    }
    outputs = folder;
  }
  return { result, outcome, outputs, extraFailure };
}
