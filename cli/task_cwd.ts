/**
 * `deno task kcoral …` runs in the checkout (where `deno.json` is), not where it was typed, so
 * `--send .` would send the checkout and `--out dir` land in it. The task passes the directory it
 * was started from (`INIT_CWD`, which `deno task` sets) as `KCORAL_TASK_CWD`; the command moves
 * there before anything else, and removes the variable, so a server it starts never inherits it.
 *
 * @module
 */

/** The variable `deno.json`'s `kcoral` task sets to `$INIT_CWD`. */
export const TASK_CWD_VARIABLE = "KCORAL_TASK_CWD";

/**
 * Moves to `KCORAL_TASK_CWD` when it names a directory (and forgets it); returns the directory
 * moved to, or `null`. Without permission to read the variable nothing happens.
 *
 * @example
 * ```ts
 * import { enterTaskCwd } from "./task_cwd.ts";
 *
 * const here = Deno.cwd();
 * const elsewhere = await Deno.makeTempDir();
 * Deno.env.set("KCORAL_TASK_CWD", elsewhere);
 * if (enterTaskCwd() !== elsewhere || Deno.cwd() !== await Deno.realPath(elsewhere)) {
 *   throw new Error();
 * }
 * if (Deno.env.get("KCORAL_TASK_CWD") !== undefined || enterTaskCwd() !== null) throw new Error();
 * Deno.chdir(here);
 * await Deno.remove(elsewhere);
 * ```
 */
export function enterTaskCwd(): string | null {
  try {
    const permission = Deno.permissions.querySync({ name: "env", variable: TASK_CWD_VARIABLE });
    if (permission.state !== "granted") return null;
    const dir = Deno.env.get(TASK_CWD_VARIABLE);
    Deno.env.delete(TASK_CWD_VARIABLE);
    if (!dir) return null;
    Deno.chdir(dir);
    return dir;
  } catch {
    return null; // not a directory we can enter: stay where deno task put us
  }
}
