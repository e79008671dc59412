/**
 * Returned files and folders, and saving them locally (spec protocol §5.5).
 *
 * Upstream opens every parent with O_NOFOLLOW through directory descriptors.
 * Deno has no openat, so the parent chain is checked with lstat (each
 * component must be a real directory, never a symbolic link) just before
 * writing; publication itself is atomic: a staging file `.kcoral-<32 hex>`
 * (mode 0600, exclusive create) is hard-linked to the destination (exclusive)
 * or renamed over it (overwrite).
 *
 * @module
 */

import { fileURLToPath } from "node:url";
import { ResultValueError, validateManifest } from "../protocol/values.ts";
import { newBoundary } from "../protocol/multipart_encode.ts";
import { pyStrRepr } from "../protocol/python_repr.ts";
import { ValidationError } from "./errors.ts";

const _decoder = new TextDecoder();

interface _Destination {
  path: string;
  parent: string;
  name: string;
}

/** Split and check a save destination; verify its parent chain has no links. */
function _destination(destination: string | URL): _Destination {
  const path = destination instanceof URL ? fileURLToPath(destination) : destination;
  if (typeof path !== "string") throw new TypeError("save destination must be a path");
  const absolute = path.startsWith("/");
  const parts = path.split("/").filter((part) => part !== "" && part !== ".");
  if (parts.includes("..") || parts.length === 0) {
    throw new ValidationError("save destination must name a file or folder without '..'");
  }
  let current = absolute ? "" : ".";
  for (const part of parts.slice(0, -1)) {
    current = `${current}/${part}`;
    const info = Deno.lstatSync(current);
    if (info.isSymlink) {
      throw new Deno.errors.FilesystemLoop(`save refuses to follow a symbolic link: ${current}`);
    }
    if (!info.isDirectory) throw new Deno.errors.NotADirectory(`not a directory: ${current}`);
  }
  const parent = current === "" ? "/" : current;
  const name = parts[parts.length - 1];
  return { path, parent, name };
}

function _lstatOrNull(path: string): Deno.FileInfo | null {
  try {
    return Deno.lstatSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
}

function _checkDestination(target: string, name: string, overwrite: boolean): void {
  const info = _lstatOrNull(target);
  if (info === null) return;
  if (!overwrite) {
    throw new Deno.errors.AlreadyExists(`save destination already exists: ${pyStrRepr(name)}`);
  }
  if (!info.isFile) throw new ValidationError("overwrite requires a regular file destination");
}

async function _removeIfPresent(path: string): Promise<void> {
  try {
    await Deno.remove(path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
}

function _join(parent: string, name: string): string {
  return parent.endsWith("/") ? parent + name : `${parent}/${name}`;
}

/**
 * A returned file: an in-memory snapshot, independent of the client and of
 * the remote workspace.
 *
 * @example
 * ```ts
 * import { ReturnedFile } from "./mod.ts";
 *
 * const file = new ReturnedFile(new TextEncoder().encode("hello\n"));
 * const dir = await Deno.makeTempDir();
 * await file.save(`${dir}/hello.txt`);
 * if (file.text() !== "hello\n" || (await Deno.readTextFile(`${dir}/hello.txt`)) !== "hello\n") {
 *   throw new Error();
 * }
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class ReturnedFile {
  readonly #data: Uint8Array;

  /** Wrap file contents (kept as given, not copied). */
  constructor(data: Uint8Array) {
    if (!(data instanceof Uint8Array)) throw new TypeError("ReturnedFile contents must be bytes");
    this.#data = data;
  }

  /** Size in bytes. */
  get size(): number {
    return this.#data.length;
  }

  /** The contents (shared with this object: do not modify). */
  bytes(): Uint8Array {
    return this.#data;
  }

  /** The contents decoded as UTF-8 (invalid sequences become U+FFFD). */
  text(): string {
    return _decoder.decode(this.#data);
  }

  /**
   * Save to exactly `destination`, whose parent must exist and be reached
   * without symbolic links; a `..` component or an empty name is a
   * {@linkcode ValidationError}. Without `overwrite` an existing entry is
   * `Deno.errors.AlreadyExists`, and publication is atomic and exclusive;
   * with it, an existing non-regular file is a `ValidationError`, otherwise
   * it is atomically replaced. Files are created with mode 0600.
   *
   * @returns the destination path.
   */
  async save(destination: string | URL, options: { overwrite?: boolean } = {}): Promise<string> {
    const overwrite = options.overwrite ?? false;
    const { path, parent, name } = _destination(destination);
    const target = _join(parent, name);
    _checkDestination(target, name, overwrite);
    const staging = _join(parent, `.kcoral-${newBoundary().slice(7)}`);
    await Deno.writeFile(staging, this.#data, { createNew: true, mode: 0o600 });
    try {
      if (overwrite) {
        _checkDestination(target, name, true);
        // A symbolic link substituted after the check is replaced, never followed.
        await Deno.rename(staging, target);
      } else {
        // Atomic exclusive publication, even if the destination appeared meanwhile.
        await Deno.link(staging, target);
      }
    } finally {
      await _removeIfPresent(staging);
    }
    return path;
  }
}

/**
 * A returned folder: `files` (relative path → {@linkcode ReturnedFile}, in
 * sorted order) and `directories` (every subdirectory, empty ones included,
 * sorted, root excluded). The manifest is validated on construction.
 *
 * @example
 * ```ts
 * import { ReturnedFile, ReturnedFolder } from "./mod.ts";
 *
 * const folder = new ReturnedFolder(
 *   new Map([["a/x.txt", new ReturnedFile(new TextEncoder().encode("x"))]]),
 *   ["a", "empty"],
 * );
 * const dir = await Deno.makeTempDir();
 * await folder.save(`${dir}/out`);
 * if ((await Deno.readTextFile(`${dir}/out/a/x.txt`)) !== "x") throw new Error();
 * if (!(await Deno.stat(`${dir}/out/empty`)).isDirectory) throw new Error();
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class ReturnedFolder {
  /** Files by relative path, in sorted order. */
  readonly files: ReadonlyMap<string, ReturnedFile>;
  /** Sorted relative directory paths (empty directories included, root excluded). */
  readonly directories: readonly string[];

  /**
   * Create a folder; `files` keys and `directories` must form a valid
   * manifest (canonical paths, sorted, no duplicates, parents listed).
   */
  constructor(
    files: ReadonlyMap<string, ReturnedFile> | Iterable<[string, ReturnedFile]>,
    directories: readonly string[] = [],
  ) {
    const entries = new Map(files);
    try {
      validateManifest([...entries.keys()], [...directories]);
    } catch (error) {
      if (error instanceof ResultValueError) throw new ValidationError(error.message);
      throw error;
    }
    for (const file of entries.values()) {
      if (!(file instanceof ReturnedFile)) {
        throw new TypeError("ReturnedFolder files must contain ReturnedFile values");
      }
    }
    this.files = entries;
    this.directories = Object.freeze([...directories]);
  }

  /**
   * Create `destination` as a new directory (mode 0700; its parent must exist
   * and be reached without symbolic links) and write the tree into it:
   * directories 0700, files 0600, all created exclusively. On any error the
   * partial tree is removed and the error re-thrown.
   *
   * @returns the destination path.
   */
  async save(destination: string | URL): Promise<string> {
    const { path, parent, name } = _destination(destination);
    const root = _join(parent, name);
    await Deno.mkdir(root, { mode: 0o700 });
    try {
      for (const directory of this.directories) {
        await Deno.mkdir(`${root}/${directory}`, { mode: 0o700 });
      }
      for (const [relative, file] of this.files) {
        await Deno.writeFile(`${root}/${relative}`, file.bytes(), { createNew: true, mode: 0o600 });
      }
    } catch (error) {
      await Deno.remove(root, { recursive: true }).catch(() => {});
      throw error;
    }
    return path;
  }
}
