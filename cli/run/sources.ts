/**
 * The Python sources `kcoral run` uploads in every request: the shared runner and the
 * selected tool's definition, read as text from `runtime_py/kcoral_runtime/tools/`.
 *
 * @module
 */

import { type ToolName, TOOLS } from "./tools.ts";

/** The two uploaded module sources of one tool run. */
export interface ToolSources {
  /** Text of `runner.py`: defines `run(archive, tool_run, arguments, overrides, fetch)`. */
  runner: string;
  /** Text of the tool's definition: defines `run(arguments, env, reports, execute)`. */
  definition: string;
}

const _DIRECTORY = new URL("../../runtime_py/kcoral_runtime/tools/", import.meta.url);

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
    _read(new URL("runner.py", _DIRECTORY)),
    _read(new URL(`${TOOLS[tool].module}.py`, _DIRECTORY)),
  ]);
  return { runner, definition };
}

async function _read(url: URL): Promise<string> {
  if (url.protocol === "file:") return await Deno.readTextFile(url);
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot read ${url.href}: HTTP ${response.status}`);
  return await response.text();
}
