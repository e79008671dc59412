/**
 * Locates the Python worker runtime (`runtime_py/kcoral_runtime`) for the server's workers: the
 * directory Python finds `kcoral_runtime` in. From a local checkout the package is used in place.
 * Otherwise (a registry, an HTTP URL, a `deno compile` binary, whose embedded paths Python cannot
 * open) it is the content-addressed copy in the user's cache (`server/runtime/runtime_cache.ts`),
 * written from the files' text imports in the module graph (`runtime_py/runtime_files.ts`, shared
 * with `kcoral run`): Deno's module cache or the binary holds them, so no start fetches anything.
 *
 * @module
 */

import { readRuntimeFiles, RUNTIME_PACKAGE_URL } from "../../runtime_py/runtime_files.ts";
import { cachedRuntime, userCacheDir } from "./runtime_cache.ts";

/** Where the runtime package is; every field has the running process's default. */
export interface RuntimeLocation {
  /** The package directory's URL (default: where this code found it, `RUNTIME_PACKAGE_URL`). */
  packageUrl?: URL;
  /** Whether this process is a `deno compile` binary (default: `Deno.build.standalone`). */
  standalone?: boolean;
  /** The user's cache directory (default: `userCacheDir()`, read only when it is needed). */
  cacheDir?: string;
  /** The runtime's files by path (default: `readRuntimeFiles()`, read only when needed). */
  texts?: ReadonlyMap<string, string>;
}

/**
 * Whether Python can read the package at `location` in place: a `file:` directory of a process
 * that is not a compiled binary.
 */
function _runtimeInPlace(location: RuntimeLocation = {}): boolean {
  const url = location.packageUrl ?? RUNTIME_PACKAGE_URL;
  return url.protocol === "file:" && !(location.standalone ?? Deno.build.standalone === true);
}

/**
 * The directory to put on `PYTHONPATH` so `python -m kcoral_runtime.zygote` works: the checkout's
 * `runtime_py/`, or `<cache>/runtime/<package-hash>` (written first when needed).
 *
 * @example
 * ```ts
 * import { runtimePythonPath } from "./runtime_files.ts";
 *
 * const local = await runtimePythonPath();
 * if (!local.endsWith("/runtime_py")) throw new Error(local);
 *
 * // As a compiled binary would: the files are written into the cache, never used in place.
 * const cacheDir = await Deno.makeTempDir();
 * const written = await runtimePythonPath({ standalone: true, cacheDir });
 * if (!written.startsWith(`${cacheDir}/runtime/`)) throw new Error(written);
 * await Deno.remove(cacheDir, { recursive: true });
 * ```
 */
export async function runtimePythonPath(location: RuntimeLocation = {}): Promise<string> {
  if (_runtimeInPlace(location)) {
    const url = location.packageUrl ?? RUNTIME_PACKAGE_URL;
    return decodeURIComponent(new URL("..", url).pathname).replace(/\/$/, "");
  }
  const runtime = await cachedRuntime({
    cacheDir: location.cacheDir ?? userCacheDir(),
    texts: location.texts ?? await readRuntimeFiles(),
  });
  return runtime.pythonPath;
}
