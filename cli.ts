/**
 * The `kcoral` command line: `kcoral run TOOL ...` and `kcoral server ...`.
 *
 * ```sh
 * deno run -A --unstable-no-legacy-abort jsr:@kcoral/cli/cli server --device cpu
 * ```
 *
 * @module
 */
import { main } from "./cli/main.ts";
import { enterTaskCwd } from "./cli/task_cwd.ts";

export { main };

if (import.meta.main) {
  // `deno task kcoral …`: paths are relative to where it was typed, not to the checkout.
  enterTaskCwd();
  Deno.exit(await main(Deno.args));
}
