/**
 * The Python sources `kcoral run` uploads in every request: the shared runner and the
 * selected tool's definition, read as text from `runtime_py/kcoral_runtime/tools/`.
 *
 * @module
 */

import { readRuntimeFile } from "../../runtime_py/runtime_files.ts";
import { type ToolName, TOOLS } from "./tools.ts";

/** The two uploaded module sources of one tool run. */
export interface ToolSources {
  /** Text of `runner.py`: defines `run(archive, tool_run, arguments, overrides, fetch)`. */
  runner: string;
  /** Text of the tool's definition: defines `run(arguments, env, reports, execute)`. */
  definition: string;
}

/**
 * Read the runner and the definition of `tool`. Works from a local checkout (`file:`) and
 * from a published package (`https:`), since the sources travel with this module.
 *
 * @example
 * ```ts
 * import { readToolSources } from "./sources.ts";
 * const { runner, definition } = await readToolSources("ncu");
 * runner.includes("def run("); // true
 * ```
 */
export async function readToolSources(tool: ToolName): Promise<ToolSources> {
  const [runner, definition] = await Promise.all([
    readRuntimeFile("tools/runner.py"),
    readRuntimeFile(`tools/${TOOLS[tool].module}.py`),
  ]);
  return { runner, definition };
}
