/**
 * The command line that starts this same `kcoral` CLI again with other arguments (the node
 * supervisor's server child): `deno run -A <cli.ts> …` when it runs as a script (from a checkout,
 * a registry or a URL), or the binary itself with the arguments when it is a `deno compile`
 * binary, which takes no `run` subcommand.
 *
 * @module
 */

/** A program and its arguments. */
export interface CommandLine {
  /** The executable. */
  command: string;
  /** Its arguments. */
  args: string[];
}

/**
 * The command line that runs this CLI with `args`. `standalone` defaults to
 * `Deno.build.standalone`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { selfCommand } from "./self_command.ts";
 *
 * const script = selfCommand(["server", "--port=1"], false);
 * assert.equal(script.command, Deno.execPath());
 * assert.deepEqual(script.args.slice(0, 2), ["run", "-A"]);
 * assert.ok(script.args[2].endsWith("/cli.ts"));
 * assert.deepEqual(script.args.slice(3), ["server", "--port=1"]);
 * assert.deepEqual(selfCommand(["server"], true).args, ["server"]);
 * ```
 */
export function selfCommand(
  args: readonly string[],
  standalone: boolean = Deno.build.standalone === true,
): CommandLine {
  if (standalone) return { command: Deno.execPath(), args: [...args] };
  return {
    command: Deno.execPath(),
    args: ["run", "-A", new URL("../cli.ts", import.meta.url).href, ...args],
  };
}
