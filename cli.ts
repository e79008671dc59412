/**
 * The `kcoral` command line: `kcoral run TOOL ...` and `kcoral server ...`.
 *
 * ```sh
 * deno run -A jsr:@kcoral/cli/cli server --device cpu
 * ```
 *
 * @module
 */
import { main } from "./cli/main.ts";

export { main };

if (import.meta.main) Deno.exit(await main(Deno.args));
