/**
 * The Python worker runtime's copy in the user's cache, `<cache>/runtime/<package-hash>/`: a node
 * not running from a checkout writes the files it carries there once and reuses the copy. A copy
 * is written beside its place and renamed in whole (two nodes starting at once never see half a
 * runtime); every start checks it against the manifest, and a damaged copy is written anew.
 *
 * @module
 */

import { errorMessage } from "../../protocol/errors.ts";
import { sha256Hex } from "../../protocol/hash.ts";
import { processEnv } from "../../options/defaults.ts";
import type { Env } from "../../options/spec.ts";
import { type RuntimeManifest, runtimeManifest } from "./runtime_manifest.ts";

/** Leftovers of materialisations (temporary and damaged copies) older than this are removed. */
const _LEFTOVER_MS = 60 * 60 * 1000;

/**
 * The user's KCoral cache directory: `$KCORAL_CACHE_DIR`, else `$XDG_CACHE_HOME/kcoral`, else
 * `~/.cache/kcoral` (each variable only when it is an absolute path).
 */
export function userCacheDir(env: Env = processEnv()): string {
  const absolute = (value: string | undefined) =>
    value && value.startsWith("/") ? value.replace(/(.)\/+$/, "$1") : null;
  const own = absolute(env.KCORAL_CACHE_DIR);
  if (own) return own;
  const xdg = absolute(env.XDG_CACHE_HOME);
  if (xdg) return `${xdg}/kcoral`;
  const home = absolute(env.HOME);
  if (home) return `${home}/.cache/kcoral`;
  throw new Error(
    "no cache directory for the KCoral Python runtime: set KCORAL_CACHE_DIR (or XDG_CACHE_HOME " +
      "or HOME) to an absolute path",
  );
}

/** The cached runtime could not be made or used. */
export class RuntimeCacheError extends Error {
  /** The cached runtime's directory (`<cache>/runtime/<package-hash>`). */
  readonly dir: string;

  /** `message`, about the cached runtime at `dir`. */
  constructor(message: string, dir: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RuntimeCacheError";
    this.dir = dir;
  }
}

/** What {@linkcode cachedRuntime} takes. */
export interface CachedRuntimeOptions {
  /** The user's cache directory ({@linkcode userCacheDir}). */
  cacheDir: string;
  /** The package's files: path inside `kcoral_runtime/` → text (`readRuntimeFiles()`). */
  texts: ReadonlyMap<string, string>;
}

/** Where {@linkcode cachedRuntime} found the runtime. */
export interface CachedRuntime {
  /** The directory to put on `PYTHONPATH` (it holds `kcoral_runtime/`). */
  readonly pythonPath: string;
  /** `cached`: a good copy was there (nothing was written); `made`: written now. */
  readonly how: "cached" | "made";
  /** The damaged file of a copy that was replaced, if one was. */
  readonly replaced?: string;
}

/** The runtime's directory in the cache, written from `texts` first when there is no good copy. */
export async function cachedRuntime(options: CachedRuntimeOptions): Promise<CachedRuntime> {
  const { cacheDir, texts } = options;
  const manifest = runtimeManifest(texts);
  const parent = `${cacheDir}/runtime`;
  const dir = `${parent}/${manifest.hash}`;
  const damaged = await _check(`${dir}/kcoral_runtime`, manifest);
  if (damaged === null) return { pythonPath: dir, how: "cached" };
  if (damaged !== _ABSENT) await _moveAside(dir, parent, manifest.hash);
  try {
    await Deno.mkdir(parent, { recursive: true });
  } catch (error) {
    throw new RuntimeCacheError(`cannot make the runtime cache ${parent}: ${error}`, dir, {
      cause: error,
    });
  }
  await _removeLeftovers(parent);
  const temp = await Deno.makeTempDir({
    dir: parent,
    prefix: `.tmp-${manifest.hash.slice(0, 16)}-`,
  });
  try {
    await _write(texts, `${temp}/kcoral_runtime`);
    try {
      await Deno.rename(temp, dir);
    } catch (error) {
      // Another node renamed its copy into place first: use that one.
      if ((await _check(`${dir}/kcoral_runtime`, manifest)) !== null) throw error;
      await Deno.remove(temp, { recursive: true });
    }
  } catch (error) {
    await Deno.remove(temp, { recursive: true }).catch(() => {});
    throw new RuntimeCacheError(`cannot write the runtime cache ${dir}: ${error}`, dir, {
      cause: error,
    });
  }
  return damaged === _ABSENT
    ? { pythonPath: dir, how: "made" }
    : { pythonPath: dir, how: "made", replaced: damaged };
}

const _ABSENT = "";

/** `null`: every file is there and good; `_ABSENT`: no copy; else what is wrong. */
async function _check(pkg: string, manifest: RuntimeManifest): Promise<string | null> {
  try {
    await Deno.stat(pkg);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return _ABSENT;
    return `${pkg}: ${error}`;
  }
  for (const [path, sha] of Object.entries(manifest.files)) {
    let bytes: Uint8Array;
    try {
      bytes = await Deno.readFile(`${pkg}/${path}`);
    } catch (error) {
      return `file ${path}: ${errorMessage(error)}`;
    }
    if (sha256Hex(bytes) !== sha) return `file ${path} has another SHA-256`;
  }
  return null;
}

async function _write(texts: ReadonlyMap<string, string>, pkg: string): Promise<void> {
  for (const [path, text] of texts) {
    const file = `${pkg}/${path}`;
    await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(file, text, { mode: 0o644 });
  }
}

/** Renames a damaged copy out of its place (atomically) and removes it. */
async function _moveAside(dir: string, parent: string, hash: string): Promise<void> {
  const aside = `${parent}/.damaged-${hash.slice(0, 16)}-${crypto.randomUUID()}`;
  try {
    await Deno.rename(dir, aside);
  } catch {
    return; // another node moved it already
  }
  await Deno.remove(aside, { recursive: true }).catch(() => {});
}

/** Removes temporary and damaged copies that crashed starts left behind. */
async function _removeLeftovers(parent: string): Promise<void> {
  const now = Date.now();
  for await (const entry of Deno.readDir(parent)) {
    if (!entry.name.startsWith(".tmp-") && !entry.name.startsWith(".damaged-")) continue;
    const path = `${parent}/${entry.name}`;
    try {
      const mtime = (await Deno.lstat(path)).mtime?.getTime() ?? now;
      if (now - mtime > _LEFTOVER_MS) await Deno.remove(path, { recursive: true });
    } catch {
      // gone already, or not ours to remove
    }
  }
}
