/**
 * `kcoral run ...` as a process: parse (help 0; argument errors 2, printed after any
 * warning, without contacting anything), print the warnings, then run the tool.
 *
 * @module
 */

import { grantedEnv } from "../../options/defaults.ts";
import { parseRunArgs, parseRunDispatcher } from "./args.ts";
import { runTool } from "./execute.ts";
import { writeText } from "./io.ts";

/**
 * Run `kcoral run ARGV...` with the process's stdio, environment and current directory;
 * resolves with the exit status. Progress is shown only when stderr is a terminal.
 *
 * @example
 * ```ts ignore
 * import { runMain } from "./main.ts";
 * Deno.exit(await runMain(["python", "--", "-c", "print('hello from the worker')"]));
 * ```
 */
export async function runMain(argv: string[]): Promise<number> {
  const dispatch = parseRunDispatcher(argv);
  if (dispatch.kind === "help") {
    writeText(Deno.stdout, dispatch.text);
    return 0;
  }
  if (dispatch.kind === "error") {
    writeText(Deno.stderr, dispatch.text);
    return 2;
  }
  const parsed = parseRunArgs(dispatch.tool, dispatch.argv, grantedEnv());
  if (parsed.kind === "help") {
    writeText(Deno.stdout, parsed.text);
    return 0;
  }
  for (const warning of parsed.warnings) writeText(Deno.stderr, `${warning}\n`);
  if (parsed.kind === "error") {
    writeText(Deno.stderr, parsed.text);
    return 2;
  }
  const isTerminal = Deno.stderr.isTerminal();
  return await runTool(parsed, {
    stdout: Deno.stdout,
    stderr: Deno.stderr,
    isTerminal,
    ...(isTerminal ? { columns: _columns() } : {}),
  });
}

function _columns(): number | undefined {
  try {
    return Deno.consoleSize().columns;
  } catch {
    return undefined;
  }
}
