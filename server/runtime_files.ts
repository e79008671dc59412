/**
 * Locates the Python worker runtime (`runtime_py/kcoral_runtime`) for the server's workers. From a
 * local checkout it is used in place; when this package runs from a registry (`jsr:`), its files
 * are fetched next to the module and written into the server's runtime directory. Where the files
 * are, and reading one, is `runtime_py/runtime_files.ts` (shared with `kcoral run`).
 *
 * @module
 */

import { RUNTIME_PACKAGE_URL } from "../runtime_py/runtime_files.ts";

/** Files of the `kcoral_runtime` package (kept equal to the directory by a test). */
export const RUNTIME_FILES: readonly string[] = [
  "__init__.py",
  "builtins.py",
  "cabi.py",
  "capture.py",
  "child.py",
  "compat/kcoral/__init__.py",
  "compat/kcoral/builtins.py",
  "compat/kcoral/errors.py",
  "cuda_guard.py",
  "devices.py",
  "engine.py",
  "errors.py",
  "files.py",
  "frames.py",
  "hygiene.py",
  "ipc.py",
  "lease.py",
  "libraries.py",
  "log.py",
  "modules.py",
  "nvml.py",
  "paths.py",
  "procs.py",
  "seccomp.py",
  "staging.py",
  "tools/__init__.py",
  "tools/compute_sanitizer.py",
  "tools/ncu.py",
  "tools/python.py",
  "tools/run_iket.py",
  "tools/runner.py",
  "tools/shell.py",
  "values.py",
  "workspace.py",
  "zygote.py",
];

/**
 * The directory to put on `PYTHONPATH` so `python -m kcoral_runtime.zygote` works.
 * Remote packages are materialized under `<runtimeDir>/python`.
 */
export async function runtimePythonPath(runtimeDir: string): Promise<string> {
  if (RUNTIME_PACKAGE_URL.protocol === "file:") {
    return decodeURIComponent(new URL("..", RUNTIME_PACKAGE_URL).pathname).replace(/\/$/, "");
  }
  const root = `${runtimeDir}/python`;
  await materializeRuntime(RUNTIME_PACKAGE_URL, `${root}/kcoral_runtime`);
  return root;
}

/** Copies every file of {@linkcode RUNTIME_FILES} from `packageUrl` (any fetchable URL) to `dir`. */
export async function materializeRuntime(packageUrl: URL, dir: string): Promise<void> {
  for (const name of RUNTIME_FILES) {
    const url = new URL(name, packageUrl);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
    const path = `${dir}/${name}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(path, await response.text());
  }
}
