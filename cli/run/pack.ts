/**
 * Packing `--send` inputs into the deterministic tar archive the runner unpacks into the
 * remote working directory.
 *
 * Layout: a file is stored under its own name (`experiment/check.py` -> `check.py`); a
 * directory keeps its name and inner layout (`/local/experiment` -> `experiment/...`; `.`
 * uses the current directory's name; trailing slashes change nothing). Every selection
 * shares one namespace: a duplicate name, or a name that is also a directory of another
 * (`a` and `a/b`), is refused.
 *
 * Contents: regular files only. A selected path that is missing or a symlink, a symlink
 * anywhere below a selected directory, and any special file are refused. Empty directories
 * are not stored, hidden files are. Entries named `__pycache__` below a selected directory
 * are skipped with everything under them. Decision: only components *below* the selected
 * root count, so `--send build/__pycache__/tool` or `--send x/__pycache__` still sends
 * what was named explicitly (upstream checked every component of the local path and
 * silently sent nothing). Only the executable bit of the mode survives (0700 or 0600).
 *
 * @module
 */

import { basename } from "node:path";
import { compareCodePoints, normalizePath, relativeParts } from "./paths.ts";
import { type TarFile, writeTar } from "./tar.ts";

/** A packing failure (bad input selection or an I/O error); the CLI exits 1 with it. */
export class PackError extends Error {
  /**
   * Create a packing error.
   *
   * @param message The message printed after `kcoral run TOOL: `.
   * @param options `cause`: the underlying error, if any.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PackError";
  }
}

/** One file of a packed archive. */
export interface PackedFile {
  /** Remote path relative to the remote working directory, e.g. `experiment/check.py`. */
  name: string;
  /** Size in bytes. */
  size: number;
  /** Whether any execute bit was set locally (stored as mode 0700, else 0600). */
  executable: boolean;
}

/** Progress of {@linkcode packInputs}: the files and bytes read so far. */
export interface PackProgress {
  /** Files archived so far. */
  files: number;
  /** Their total size in bytes. */
  bytes: number;
}

/** Options of {@linkcode packInputs}. */
export interface PackOptions {
  /** Called after each file is read (for a progress display). */
  onProgress?: (progress: PackProgress) => void;
  /** Files given in memory, archived before the selections (name → contents, mode 0600). */
  inline?: ReadonlyMap<string, Uint8Array>;
}

/** Result of {@linkcode packInputs}. */
export interface PackedInputs {
  /** The uncompressed tar archive. */
  tar: Uint8Array;
  /** The archived files, in archive order. */
  files: PackedFile[];
}

/**
 * Pack the `--send` selections `paths` (relative ones resolved against `cwd`, default the
 * current directory). The same file contents, names and executable bits always give the
 * same bytes, whatever the mtimes, owners or other permission bits. No selection gives a
 * valid empty archive. `options.onProgress` is called after each file is read.
 *
 * @throws {PackError} for a refused selection or a file system error.
 *
 * @example
 * ```ts ignore
 * import { packInputs } from "./pack.ts";
 * const { tar, files } = await packInputs(["experiment", "config.json"]);
 * ```
 */
export async function packInputs(
  paths: readonly string[],
  cwd: string = Deno.cwd(),
  options: PackOptions = {},
): Promise<PackedInputs> {
  const members: TarFile[] = [];
  const files: PackedFile[] = [];
  const names = new Set<string>();
  const directories = new Set<string>();
  let bytes = 0;
  const add = (name: string, data: Uint8Array, executable: boolean) => {
    const checked = relativeParts(name);
    if ("error" in checked) throw new PackError(checked.error);
    const canonical = checked.parts.join("/");
    const ancestors = checked.parts.slice(1).map((_, index) =>
      checked.parts.slice(0, index + 1).join("/")
    );
    if (
      names.has(canonical) || directories.has(canonical) ||
      ancestors.some((ancestor) => names.has(ancestor))
    ) {
      throw new PackError(`duplicate or conflicting input path: ${canonical}`);
    }
    names.add(canonical);
    for (const ancestor of ancestors) directories.add(ancestor);
    members.push({ name: canonical, data, mode: executable ? 0o700 : 0o600 });
    files.push({ name: canonical, size: data.length, executable });
    bytes += data.length;
    options.onProgress?.({ files: files.length, bytes });
  };
  for (const [name, data] of options.inline ?? []) add(name, data, false);
  for (const path of paths) {
    const shown = normalizePath(path);
    // Joined, not resolved: `..` after a symlink must follow the link as the kernel does.
    const local = shown.startsWith("/") ? shown : `${cwd}/${shown}`;
    const info = await _lstat(local, `input must exist and not be a symlink: ${shown}`);
    if (info.isSymlink) throw new PackError(`input must exist and not be a symlink: ${shown}`);
    if (info.isDirectory) {
      const name = basename(await _io(() => Deno.realPath(local)));
      if (name === "") throw new PackError(`input directory must have a name: ${shown}`);
      await _walk(local, shown === "." ? "" : shown, [], async (parts, entry, isExecutable) => {
        add(`${name}/${parts.join("/")}`, await _io(() => Deno.readFile(entry)), isExecutable);
      });
    } else if (info.isFile) {
      add(basename(shown), await _io(() => Deno.readFile(local)), _executable(info));
    } else {
      throw new PackError(`input is not a regular file: ${shown}`);
    }
  }
  return { tar: writeTar(members), files };
}

type _Visit = (parts: string[], local: string, executable: boolean) => Promise<void>;

// Depth-first in code-point order of names: the order of Python's sorted(path.rglob("*")).
async function _walk(local: string, shown: string, parts: string[], visit: _Visit) {
  const children = await _io(async () => {
    const names: string[] = [];
    for await (const entry of Deno.readDir(local)) names.push(entry.name);
    return names.sort(compareCodePoints);
  });
  for (const child of children) {
    if (child === "__pycache__") continue;
    const childLocal = `${local}/${child}`;
    const childParts = [...parts, child];
    const childShown = shown === "" ? childParts.join("/") : `${shown}/${childParts.join("/")}`;
    const info = await _lstat(childLocal, `input must exist and not be a symlink: ${childShown}`);
    if (info.isSymlink) throw new PackError(`symlink inputs are not supported: ${childShown}`);
    if (info.isDirectory) await _walk(childLocal, shown, childParts, visit);
    else if (info.isFile) await visit(childParts, childLocal, _executable(info));
    else throw new PackError(`input is not a regular file: ${childShown}`);
  }
}

function _executable(info: Deno.FileInfo): boolean {
  return ((info.mode ?? 0) & 0o111) !== 0;
}

async function _lstat(path: string, missing: string): Promise<Deno.FileInfo> {
  try {
    return await Deno.lstat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
      throw new PackError(missing, { cause: error });
    }
    throw new PackError(_message(error), { cause: error });
  }
}

async function _io<T>(operation: () => Promise<T>): Promise<T> {
  try {
    return await operation();
  } catch (error) {
    throw new PackError(_message(error), { cause: error });
  }
}

function _message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
