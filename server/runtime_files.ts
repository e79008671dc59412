/**
 * Locates the Python worker runtime (`runtime_py/kcoral_runtime`) for the server's workers: the
 * directory Python finds `kcoral_runtime` in. From a local checkout the package is used in place.
 * Otherwise it is the content-addressed copy in the user's cache (`server/runtime_cache.ts`):
 * fetched once when this code runs from a registry or an HTTP URL; extracted from the embedded
 * file system when it runs as a `deno compile` binary, whose paths only this process can read,
 * never Python. Where the package is, and reading one file, is `runtime_py/runtime_files.ts`
 * (shared with `kcoral run`).
 *
 * @module
 */

import { RUNTIME_PACKAGE_URL } from "../runtime_py/runtime_files.ts";
import { cachedRuntime, userCacheDir } from "./runtime_cache.ts";
import { RUNTIME_MANIFEST, type RuntimeManifest } from "./runtime_manifest.ts";
import { embeddedSource, fetchedSource, type RuntimeSource } from "./runtime_sources.ts";

/** Where the runtime package is and how it is read; every field has the running process's default. */
export interface RuntimeLocation {
  /** The package directory's URL (default: where this code found it, `RUNTIME_PACKAGE_URL`). */
  packageUrl?: URL;
  /** Whether this process is a `deno compile` binary (default: `Deno.build.standalone`). */
  standalone?: boolean;
  /** The user's cache directory (default: `userCacheDir()`, read only when it is needed). */
  cacheDir?: string;
  /** The package's manifest (default: the one this code was built with). */
  manifest?: RuntimeManifest;
}

/**
 * How the runtime is reached for `location`: `in-place` (a checkout's `file:` directory, which
 * Python reads as it is), or the source its cached copy is made from.
 *
 * @example
 * ```ts
 * import { runtimeSource } from "./runtime_files.ts";
 *
 * const local = new URL("file:///srv/kcoral/runtime_py/kcoral_runtime/");
 * if (runtimeSource({ packageUrl: local, standalone: false }) !== "in-place") throw new Error();
 * const embedded = runtimeSource({ packageUrl: local, standalone: true });
 * if (embedded === "in-place" || embedded.url.href !== local.href) throw new Error();
 * const remote = runtimeSource({ packageUrl: new URL("https://jsr.example/rt/"), standalone: false });
 * if (remote === "in-place") throw new Error();
 * ```
 */
export function runtimeSource(location: RuntimeLocation = {}): "in-place" | RuntimeSource {
  const url = location.packageUrl ?? RUNTIME_PACKAGE_URL;
  if (url.protocol !== "file:") return fetchedSource(url);
  return (location.standalone ?? _standalone()) ? embeddedSource(url) : "in-place";
}

/**
 * The directory to put on `PYTHONPATH` so `python -m kcoral_runtime.zygote` works: the checkout's
 * `runtime_py/`, or `<cache>/runtime/<package-hash>` (made first when needed).
 *
 * @example
 * ```ts
 * import { runtimePythonPath } from "./runtime_files.ts";
 *
 * const local = await runtimePythonPath();
 * if (!local.endsWith("/runtime_py")) throw new Error(local);
 *
 * // As a compiled binary would: the tree is extracted into the cache, never used in place.
 * const cacheDir = await Deno.makeTempDir();
 * const extracted = await runtimePythonPath({ standalone: true, cacheDir });
 * if (!extracted.startsWith(`${cacheDir}/runtime/`)) throw new Error(extracted);
 * await Deno.remove(cacheDir, { recursive: true });
 * ```
 */
export async function runtimePythonPath(location: RuntimeLocation = {}): Promise<string> {
  const source = runtimeSource(location);
  if (source === "in-place") {
    return decodeURIComponent(new URL("..", _url(location)).pathname).replace(/\/$/, "");
  }
  const runtime = await cachedRuntime({
    cacheDir: location.cacheDir ?? userCacheDir(),
    manifest: location.manifest ?? RUNTIME_MANIFEST,
    source,
  });
  return runtime.pythonPath;
}

function _url(location: RuntimeLocation): URL {
  return location.packageUrl ?? RUNTIME_PACKAGE_URL;
}

function _standalone(): boolean {
  return Deno.build.standalone === true;
}
