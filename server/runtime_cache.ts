/**
 * The Python worker runtime's copy in the user's cache directory, keyed by the package hash of
 * its manifest: `<cache>/runtime/<package-hash>/kcoral_runtime/…`. A node that does not run from
 * a checkout (a registry, an HTTP URL, a `deno compile` binary) materialises it once and reuses
 * it on every later start without touching the network.
 *
 * A copy is made in a temporary directory beside its place, each file checked against the
 * manifest's SHA-256 as it arrives, and renamed into place whole, so two nodes starting at once
 * never see half a runtime (the loser of the rename uses the winner's copy). Every start checks
 * the cached files against the manifest again (35 small files, a few milliseconds); a damaged
 * copy is moved aside and made anew from the source, and when the source cannot be reached
 * either, the error says both.
 *
 * @module
 */

import { sha256Hex } from "../protocol/hash.ts";
import { processEnv } from "../options/defaults.ts";
import type { Env } from "../options/spec.ts";
import type { RuntimeManifest } from "./runtime_manifest.ts";
import { type RuntimeSource, RuntimeSourceError } from "./runtime_sources.ts";

/** Leftovers of materialisations (temporary and damaged copies) older than this are removed. */
const _LEFTOVER_MS = 60 * 60 * 1000;

/**
 * The user's KCoral cache directory: `$KCORAL_CACHE_DIR`, else `$XDG_CACHE_HOME/kcoral`, else
 * `~/.cache/kcoral` (each variable only when it is an absolute path).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { userCacheDir } from "./runtime_cache.ts";
 *
 * assert.equal(userCacheDir({ KCORAL_CACHE_DIR: "/srv/kc/", HOME: "/h" }), "/srv/kc");
 * assert.equal(userCacheDir({ XDG_CACHE_HOME: "/x", HOME: "/h" }), "/x/kcoral");
 * assert.equal(userCacheDir({ XDG_CACHE_HOME: "rel", HOME: "/h" }), "/h/.cache/kcoral");
 * assert.throws(() => userCacheDir({}), /KCORAL_CACHE_DIR/);
 * ```
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

  /**
   * `message`, about the cached runtime at `dir`.
   *
   * @example
   * ```ts
   * import { RuntimeCacheError } from "./runtime_cache.ts";
   *
   * const error = new RuntimeCacheError("no copy", "/c/runtime/ab");
   * if (error.dir !== "/c/runtime/ab" || error.name !== "RuntimeCacheError") throw new Error();
   * ```
   */
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
  /** The package's files and hash. */
  manifest: RuntimeManifest;
  /** Where the files come from when the cache has no good copy. */
  source: RuntimeSource;
}

/** Where {@linkcode cachedRuntime} found the runtime. */
export interface CachedRuntime {
  /** The directory to put on `PYTHONPATH` (it holds `kcoral_runtime/`). */
  readonly pythonPath: string;
  /** `cached`: a good copy was there (no source was read); `made`: copied from the source now. */
  readonly how: "cached" | "made";
  /** The damaged file of a copy that was replaced, if one was. */
  readonly replaced?: string;
}

/**
 * The runtime's directory in the cache, made from `source` first when there is no good copy.
 *
 * @example
 * ```ts
 * import { cachedRuntime } from "./runtime_cache.ts";
 * import { RUNTIME_MANIFEST } from "./runtime_manifest.ts";
 * import { embeddedSource } from "./runtime_sources.ts";
 *
 * const cacheDir = await Deno.makeTempDir();
 * const source = embeddedSource(new URL("../runtime_py/kcoral_runtime/", import.meta.url));
 * const first = await cachedRuntime({ cacheDir, manifest: RUNTIME_MANIFEST, source });
 * if (first.how !== "made") throw new Error();
 * const offline = { url: source.url, read: () => Promise.reject(new Error("offline")) };
 * const again = await cachedRuntime({ cacheDir, manifest: RUNTIME_MANIFEST, source: offline });
 * if (again.how !== "cached" || again.pythonPath !== first.pythonPath) throw new Error();
 * await Deno.remove(cacheDir, { recursive: true });
 * ```
 */
export async function cachedRuntime(options: CachedRuntimeOptions): Promise<CachedRuntime> {
  const { cacheDir, manifest, source } = options;
  const parent = `${cacheDir}/runtime`;
  const dir = `${parent}/${manifest.hash}`;
  const damaged = await _check(`${dir}/kcoral_runtime`, manifest);
  if (damaged === null) return { pythonPath: dir, how: "cached" };
  const state = damaged === _ABSENT
    ? `no cached copy under ${dir}`
    : `the cached copy under ${dir} is damaged (${damaged})`;
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
    await _copy(source, manifest, `${temp}/kcoral_runtime`);
    try {
      await Deno.rename(temp, dir);
    } catch (error) {
      // Another node renamed its copy into place first: use that one.
      if ((await _check(`${dir}/kcoral_runtime`, manifest)) !== null) throw error;
      await Deno.remove(temp, { recursive: true });
    }
  } catch (error) {
    await Deno.remove(temp, { recursive: true }).catch(() => {});
    if (error instanceof RuntimeSourceError || error instanceof RuntimeHashError) {
      throw new RuntimeCacheError(`${error.message}; ${state}`, dir, { cause: error });
    }
    throw new RuntimeCacheError(`cannot write the runtime cache ${dir}: ${error}`, dir, {
      cause: error,
    });
  }
  return damaged === _ABSENT
    ? { pythonPath: dir, how: "made" }
    : { pythonPath: dir, how: "made", replaced: damaged };
}

/** A file from the source whose SHA-256 is not the manifest's. */
export class RuntimeHashError extends Error {
  /**
   * File `path` read from `url` hashes to `got`, not `expected`.
   *
   * @example
   * ```ts
   * import { RuntimeHashError } from "./runtime_cache.ts";
   *
   * const error = new RuntimeHashError("a.py", new URL("https://h/rt/a.py"), "00", "11");
   * if (!error.message.includes("SHA-256 11, not 00")) throw new Error(error.message);
   * ```
   */
  constructor(path: string, url: URL, expected: string, got: string) {
    super(
      `the KCoral Python runtime file ${path} from ${url} has SHA-256 ${got}, not ${expected} as ` +
        "this version's manifest says (a different or altered runtime is served there)",
    );
    this.name = "RuntimeHashError";
  }
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
      return `file ${path}: ${error instanceof Error ? error.message : error}`;
    }
    if (sha256Hex(bytes) !== sha) return `file ${path} has another SHA-256`;
  }
  return null;
}

async function _copy(source: RuntimeSource, manifest: RuntimeManifest, pkg: string) {
  // Every copy ends before a failure is thrown, so none writes into the removed temporary copy.
  const copies = await Promise.allSettled(
    Object.entries(manifest.files).map(async ([path, sha]) => {
      const bytes = await source.read(path);
      const got = sha256Hex(bytes);
      if (got !== sha) throw new RuntimeHashError(path, new URL(path, source.url), sha, got);
      const file = `${pkg}/${path}`;
      await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
      await Deno.writeFile(file, bytes, { mode: 0o644 });
    }),
  );
  const failed = copies.find((copy) => copy.status === "rejected");
  if (failed) throw failed.reason;
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
