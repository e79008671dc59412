/**
 * Locates the Python worker runtime (`runtime_py/kcoral_runtime`). From a local checkout it is
 * used in place; when this package runs from a registry (`jsr:`), its files are fetched next to
 * the module and written into the server's runtime directory.
 *
 * @module
 */

/** Files of the `kcoral_runtime` package (kept equal to the directory by a test). */
export const RUNTIME_FILES: readonly string[] = [];

const _PACKAGE_URL = new URL("../runtime_py/kcoral_runtime/", import.meta.url);

/** URL of a file of the runtime package (e.g. `tools/runner.py`). */
export function runtimeFileUrl(name: string): URL {
  return new URL(name, _PACKAGE_URL);
}

/** Reads one runtime file as text (local or remote). */
export async function readRuntimeFile(name: string): Promise<string> {
  const url = runtimeFileUrl(name);
  if (url.protocol === "file:") return await Deno.readTextFile(url);
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
  return await response.text();
}

/**
 * The directory to put on `PYTHONPATH` so `python -m kcoral_runtime.zygote` works.
 * Remote packages are materialized under `<runtimeDir>/python`.
 */
export async function runtimePythonPath(runtimeDir: string): Promise<string> {
  if (_PACKAGE_URL.protocol === "file:") {
    return decodeURIComponent(new URL("..", _PACKAGE_URL).pathname).replace(/\/$/, "");
  }
  const root = `${runtimeDir}/python`;
  for (const name of RUNTIME_FILES) {
    const path = `${root}/kcoral_runtime/${name}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(path, await readRuntimeFile(name));
  }
  return root;
}
