/**
 * The `--out` directory of `kcoral run`: it must be new, which is checked before anything
 * is sent, and its parent directories are created before the request.
 *
 * @module
 */

/** `--out` names an existing entry (a dangling symbolic link included). */
export class OutputExistsError extends Error {
  /**
   * Create the error for `out` as given on the command line.
   *
   * @param out The `--out` value.
   */
  constructor(out: string) {
    super(`output already exists; choose a new --out directory: ${out}`);
    this.name = "OutputExistsError";
  }
}

/**
 * Check that `out` (relative to `cwd`) does not exist, not even as a dangling symbolic
 * link. A value naming no new component (empty, `.`, `..`, `/`) always exists.
 *
 * @throws {OutputExistsError} when it exists.
 * @throws {Deno.errors.PermissionDenied} (or another file system error) when it cannot be
 * checked.
 *
 * @example
 * ```ts
 * import { assertNewOutput } from "./output.ts";
 * const cwd = await Deno.makeTempDir();
 * await assertNewOutput("artifacts/run-1", cwd); // fine: nothing there yet
 * await assertNewOutput(".", cwd).catch((error) => error.message);
 * // "output already exists; choose a new --out directory: ."
 * await Deno.remove(cwd);
 * ```
 */
export async function assertNewOutput(out: string, cwd: string = Deno.cwd()): Promise<void> {
  const target = _split(out, cwd);
  if (target === null) throw new OutputExistsError(out);
  try {
    await Deno.lstat(`${target.parent}/${target.name}`);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
      return;
    }
    throw error;
  }
  throw new OutputExistsError(out);
}

/**
 * Create the parent directories of `out` (`mkdir -p`) and return the path to save the
 * artifacts to: the real path of the parent joined with the last component of `out`, so
 * that saving, which refuses to follow symbolic links, accepts parents reached through
 * links (`/tmp` -> `/private/tmp`) and `..` components.
 *
 * @throws {OutputExistsError} when `out` ends in `..` or names no component.
 *
 * @example
 * ```ts
 * import { prepareOutput } from "./output.ts";
 * const cwd = await Deno.realPath(await Deno.makeTempDir());
 * await prepareOutput("a/b/out", cwd); // `${cwd}/a/b/out`; a/b now exists
 * await Deno.remove(cwd, { recursive: true });
 * ```
 */
export async function prepareOutput(out: string, cwd: string = Deno.cwd()): Promise<string> {
  const target = _split(out, cwd);
  if (target === null) throw new OutputExistsError(out);
  await Deno.mkdir(target.parent, { recursive: true });
  const real = await Deno.realPath(target.parent);
  return real === "/" ? `/${target.name}` : `${real}/${target.name}`;
}

// The parent and last component of `out`, ignoring empty and `.` components as Python's
// `Path` does; null when the last component is `..` or there is none (`.`, `/`, empty):
// such a path names an existing directory. `..` inside is kept: the kernel follows it
// after a symbolic link, so the path is joined, never resolved lexically.
function _split(out: string, cwd: string): { parent: string; name: string } | null {
  const absolute = out.startsWith("/") ? out : `${cwd}/${out}`;
  const parts = absolute.split("/").filter((part) => part !== "" && part !== ".");
  const name = parts.at(-1);
  if (name === undefined || name === "..") return null;
  return { parent: `/${parts.slice(0, -1).join("/")}`, name };
}
