/**
 * Locates the Python worker runtime for the server's workers: from a local checkout the package
 * in place, otherwise (a registry, a URL, a `deno compile` binary) its copy in the user's cache,
 * written from the files' text imports in the module graph, so no start fetches anything.
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

/** Whether Python can read the package in place: a `file:` directory, not a compiled binary. */
function _runtimeInPlace(location: RuntimeLocation = {}): boolean {
  const url = location.packageUrl ?? RUNTIME_PACKAGE_URL;
  return url.protocol === "file:" && !(location.standalone ?? Deno.build.standalone === true);
}

/**
 * The directory to put on `PYTHONPATH` for `python -m kcoral_runtime.zygote`: the checkout's
 * `runtime_py/`, or `<cache>/runtime/<package-hash>` (written first when needed).
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
