/**
 * Per-request workspaces: every request runs in a working directory of its own, and that
 * directory is gone once the request is answered (seed 001: "the request's working directory,
 * which is removed when the request finishes").
 *
 * A seat keeps its workspaces under `<runtime>/slots/<k>/ws/` on the host, named `w1`, `w2`, ...
 * Without a sandbox the program's working directory is that host directory; inside a sandbox it
 * is always `/work`, where the slot's zygote binds the current one
 * (`runtime_py/kcoral_runtime/workspace.py`).
 *
 * ```
 *   ws/w7 ──(request 7 answered: rename)──> trash/<uuid> ──(emptied in place)──> spare
 *   spare ──(seat readied for request 8: rename)──> ws/w8
 * ```
 *
 * A finished workspace leaves its path with one `rename` before the answer goes out, however
 * much the program left in it. Its directory is then emptied where it lies (the sandbox's
 * reserved `.kcoral/...` directories kept, emptied too) and serves as a later workspace under a
 * new name: on a disk mounted with `discard`, making and removing the ten directories of a
 * sandboxed workspace cost ~1.2 ms and ~3 ms per request, emptying an empty one ~0.03 ms
 * (docs/decisions/per-request-workspaces.md). A directory that cannot be emptied is removed instead. A seat keeps one
 * emptied directory in hand, so making the next workspace never waits for the last one to be
 * emptied.
 *
 * @module
 */

/** The directory the sandbox reserves inside each workspace (uploads into it fail). */
export const RESERVED_DIR = ".kcoral";
/** Private directories of a sandboxed workspace (`$HOME`, `$TMPDIR`, caches; spec server §7.1). */
export const RESERVED_SUBDIRS: readonly string[] = [
  "tmp",
  "home",
  "cache",
  "cuda",
  "triton",
  "extensions",
  "libraries",
  "shm",
];

/**
 * The workspaces of one seat.
 *
 * @example
 * ```ts
 * import { SeatWorkspaces } from "./workspace.ts";
 *
 * const root = await Deno.makeTempDir();
 * const workspaces = new SeatWorkspaces(`${root}/ws`, `${root}/trash`, false);
 * const first = await workspaces.create();
 * const path = workspaces.hostPath;
 * await Deno.writeTextFile(`${path}/left-behind`, "x");
 * await workspaces.retire(first);
 * if (await Deno.stat(path).then(() => true, () => false)) throw new Error("still there");
 * await workspaces.create(); // w2: an emptied directory, under a new name
 * if ([...Deno.readDirSync(workspaces.hostPath)].length !== 0) throw new Error("not empty");
 * await Deno.remove(root, { recursive: true });
 * ```
 */
export class SeatWorkspaces {
  /** Host directory holding the seat's workspaces (bound at `/kcoral/ws` in a sandbox). */
  readonly root: string;
  /** Whether the seat's workers run in a sandbox (workspaces then hold `.kcoral/...`). */
  readonly sandboxed: boolean;
  readonly #trash: string;
  #sequence = 0;
  #current: string | null = null;
  /** Emptied directories (in the trash) ready to become workspaces. */
  #spares: string[] = [];
  /** The retired workspace being emptied. */
  #emptying: Promise<void> = Promise.resolve();

  /**
   * `root` is created on first use; `trash` is where finished workspaces are emptied (on the
   * same file system as `root`; several seats may share it).
   */
  constructor(root: string, trash: string, sandboxed: boolean) {
    this.root = root;
    this.#trash = trash;
    this.sandboxed = sandboxed;
  }

  /** Name of the current workspace (`w<n>`); throws before the first {@linkcode create}. */
  get current(): string {
    if (this.#current === null) throw new Error("the seat has no workspace yet");
    return this.#current;
  }

  /** Host path of the current workspace. */
  get hostPath(): string {
    return `${this.root}/${this.current}`;
  }

  /** The current workspace as the worker sees it: `/work` in a sandbox, else the host path. */
  get workerPath(): string {
    return this.sandboxed ? "/work" : this.hostPath;
  }

  /**
   * Makes a new, empty workspace under a new name (mode 0700; in a sandbox with its reserved
   * directories) and makes it current; returns its name. An emptied directory in hand is used
   * (the first call makes one to hand); without one, the last retired workspace is waited for.
   */
  async create(): Promise<string> {
    if (this.#sequence === 0) {
      Deno.mkdirSync(this.root, { recursive: true, mode: 0o700 });
      Deno.mkdirSync(this.#trash, { recursive: true, mode: 0o700 });
      this.#spares.push(this.#makeDirectory(`${this.#trash}/${crypto.randomUUID()}`));
    }
    if (this.#spares.length === 0) await this.#emptying;
    const name = `w${++this.#sequence}`;
    const path = `${this.root}/${name}`;
    const spare = this.#spares.shift();
    if (spare !== undefined) Deno.renameSync(spare, path);
    else this.#makeDirectory(path);
    this.#current = name;
    return name;
  }

  #makeDirectory(path: string): string {
    Deno.mkdirSync(path, { mode: 0o700 });
    if (this.sandboxed) _makeReserved(path);
    return path;
  }

  /**
   * Moves workspace `name` out of its place at once (its path stops existing), then empties it
   * in the background for reuse; the returned promise settles when that is done.
   */
  retire(name: string): Promise<void> {
    const from = `${this.root}/${name}`;
    const to = `${this.#trash}/${crypto.randomUUID()}`;
    try {
      Deno.renameSync(from, to);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return Promise.resolve();
      // A program made it unmovable: it is removed in place (its path goes all the same).
      return _removeTree(from);
    }
    this.#emptying = this.#emptying.then(async () => {
      try {
        await _emptyForReuse(to, this.sandboxed);
        if (this.#spares.length < _SPARES) {
          this.#spares.push(to);
          return;
        }
      } catch {
        // not reusable: removed below
      }
      await _removeTree(to).catch(() => {});
    });
    return this.#emptying;
  }
}

/** Emptied directories a seat keeps in hand (one being emptied besides is enough). */
const _SPARES = 2;

function _makeReserved(path: string): void {
  Deno.mkdirSync(`${path}/${RESERVED_DIR}`, { mode: 0o700 });
  for (const sub of RESERVED_SUBDIRS) {
    Deno.mkdirSync(`${path}/${RESERVED_DIR}/${sub}`, { mode: 0o700 });
  }
}

/**
 * Empties a finished workspace in place and, for a sandbox, leaves exactly the empty reserved
 * directories `.kcoral/{tmp,home,...}` (emptied rather than made anew: fewer metadata writes).
 * Modes a program changed are reset to `0700`.
 */
async function _emptyForReuse(dir: string, sandboxed: boolean): Promise<void> {
  _ownerOnly(dir);
  if (!sandboxed) return await _empty(dir);
  let hasReserved = false;
  for (const entry of [...Deno.readDirSync(dir)]) {
    if (entry.name === RESERVED_DIR && entry.isDirectory) hasReserved = true;
    else await _removeTree(`${dir}/${entry.name}`);
  }
  const reserved = `${dir}/${RESERVED_DIR}`;
  // Made only when missing: a failed mkdir costs an exception (~0.26 ms on the 2-core VM).
  if (hasReserved) _ownerOnly(reserved);
  else Deno.mkdirSync(reserved, { mode: 0o700 });
  const kept = new Set<string>();
  for (const entry of [...Deno.readDirSync(reserved)]) {
    // Only real directories are kept: a symlink or file in their place is removed.
    if (entry.isDirectory && RESERVED_SUBDIRS.includes(entry.name)) kept.add(entry.name);
    else await _removeTree(`${reserved}/${entry.name}`);
  }
  for (const sub of RESERVED_SUBDIRS) {
    const path = `${reserved}/${sub}`;
    if (kept.has(sub)) {
      _ownerOnly(path);
      await _empty(path);
    } else {
      Deno.mkdirSync(path, { mode: 0o700 });
    }
  }
}

/**
 * Empties a directory in place and resets its mode to `0700` (the results directory between
 * requests). Read-only directories a program left behind are opened up first; throws if an
 * entry stays.
 *
 * @example
 * ```ts
 * import { emptyDirectory } from "./workspace.ts";
 *
 * const dir = await Deno.makeTempDir();
 * await Deno.writeTextFile(`${dir}/part`, "x");
 * await emptyDirectory(dir);
 * if ([...Deno.readDirSync(dir)].length !== 0) throw new Error("not empty");
 * await Deno.remove(dir);
 * ```
 */
export async function emptyDirectory(dir: string): Promise<void> {
  _ownerOnly(dir);
  await _empty(dir);
}

// The mode check is synchronous on purpose: one cheap syscall on a directory the server owns,
// where an async op costs far more than the syscall. Removing what a program left stays
// asynchronous when it is large: a directory tree, or a file over _SYNC_UNLINK_BYTES (unlinking
// frees the file's pages in the call, ~0.12–0.15 ms per MiB on tmpfs, bench/probes/tmpfs_unlink.ts: a 64 MiB result part would hold
// the event loop ~10 ms).

/** Files up to this size are unlinked without leaving the event loop. */
const _SYNC_UNLINK_BYTES = 64 * 1024;

/** Resets a directory's mode to `0700` when a program changed it. */
function _ownerOnly(dir: string): void {
  if (((Deno.lstatSync(dir).mode ?? 0) & 0o7777) !== 0o700) Deno.chmodSync(dir, 0o700);
}

async function _empty(dir: string): Promise<void> {
  for (const entry of [...Deno.readDirSync(dir)]) {
    const path = `${dir}/${entry.name}`;
    if (entry.isFile || entry.isSymlink) {
      // One unlink: cheaper at once than through the async pool (capture files, small parts).
      try {
        if (entry.isSymlink || Deno.lstatSync(path).size <= _SYNC_UNLINK_BYTES) {
          Deno.removeSync(path);
          continue;
        }
      } catch {
        // removed below
      }
    }
    await _removeTree(path);
  }
}

/**
 * Removes a file or directory tree without following symbolic links; directories a program
 * made read-only are opened up first. A path that does not exist is not an error.
 */
async function _removeTree(path: string): Promise<void> {
  await Deno.remove(path, { recursive: true }).catch(async (error) => {
    if (error instanceof Deno.errors.NotFound) return;
    await _makeWritable(path);
    await Deno.remove(path, { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
  });
}

async function _makeWritable(path: string): Promise<void> {
  try {
    const info = await Deno.lstat(path);
    if (info.isDirectory) {
      await Deno.chmod(path, 0o700);
      for await (const entry of Deno.readDir(path)) await _makeWritable(`${path}/${entry.name}`);
    }
  } catch {
    // best effort
  }
}
