/**
 * Per-request workspaces: every request runs in a directory of its own, gone once the request is
 * answered (one `rename` before the answer goes out). The directory is then emptied in place
 * (a sandbox's reserved `.kcoral/...` directories kept) and reused under a new name, which is
 * cheaper than making and removing it (docs/decisions/per-request-workspaces.md). Inside a sandbox
 * the current workspace is always at `/work`, where the zygote binds it.
 *
 * @module
 */

/** The directory the sandbox reserves inside each workspace (uploads into it fail). */
export const RESERVED_DIR = ".kcoral";
/** Private directories of a sandboxed workspace (`$HOME`, `$TMPDIR`, caches). */
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

/** The workspaces of one seat. */
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

  /** `trash` is where finished workspaces are emptied (on `root`'s file system; may be shared). */
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
   * Makes a new, empty workspace (0700, with a sandbox's reserved directories) current and
   * returns its name; waits for the last retired one only when no emptied directory is in hand.
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

  /** Moves workspace `name` out of its place at once, then empties it in the background. */
  retire(name: string): Promise<void> {
    const from = `${this.root}/${name}`;
    const to = `${this.#trash}/${crypto.randomUUID()}`;
    try {
      Deno.renameSync(from, to);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return Promise.resolve();
      // A program made it unmovable: it is removed in place.
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

/** Empties a finished workspace in place, a sandbox's reserved directories kept (mode 0700). */
async function _emptyForReuse(dir: string, sandboxed: boolean): Promise<void> {
  _ownerOnly(dir);
  if (!sandboxed) return await _empty(dir);
  let hasReserved = false;
  for (const entry of [...Deno.readDirSync(dir)]) {
    if (entry.name === RESERVED_DIR && entry.isDirectory) hasReserved = true;
    else await _removeTree(`${dir}/${entry.name}`);
  }
  const reserved = `${dir}/${RESERVED_DIR}`;
  if (hasReserved) _ownerOnly(reserved);
  else Deno.mkdirSync(reserved, { mode: 0o700 });
  const kept = new Set<string>();
  for (const entry of [...Deno.readDirSync(reserved)]) {
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

/** Empties a directory in place (read-only leftovers opened up) and resets its mode to `0700`. */
export async function emptyDirectory(dir: string): Promise<void> {
  _ownerOnly(dir);
  await _empty(dir);
}

/** Files up to this size are unlinked synchronously (a large unlink would hold the event loop). */
const _SYNC_UNLINK_BYTES = 64 * 1024;

/** Resets a directory's mode to `0700` when a program changed it. */
function _ownerOnly(dir: string): void {
  if (((Deno.lstatSync(dir).mode ?? 0) & 0o7777) !== 0o700) Deno.chmodSync(dir, 0o700);
}

async function _empty(dir: string): Promise<void> {
  for (const entry of [...Deno.readDirSync(dir)]) {
    const path = `${dir}/${entry.name}`;
    if (entry.isFile || entry.isSymlink) {
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

/** Removes a file or tree without following symlinks, opening up read-only directories. */
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
