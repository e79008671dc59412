/**
 * The GPU gate's shim (runtime_py/kcoral_runtime/gate_shim.py), built once when a GPU server
 * (real or simulated) starts: the worker interpreter runs `python -m kcoral_runtime.gate_shim
 * DIR`, which compiles the C source it holds with `cc`. Workers are told where the library is
 * (`KCORAL_GATE_LIB`, server/workers/sandbox.ts): the processes a `kcoral run python` or `shell`
 * request starts then take the GPU lease at their first CUDA call instead of holding it from start
 * to end (docs/decisions/script-gpu-gate.md, "A script holds the GPU only while it uses it").
 * Without a compiler, or when the build fails, the server runs without the gate (every run holds the lease for its
 * whole life, as before) and says why.
 *
 * @module
 */

/**
 * The outcome of {@linkcode buildGateLibrary}: the library's path, or why there is none.
 *
 * @example
 * ```ts
 * import type { GateLibrary } from "./gate_library.ts";
 *
 * const none: GateLibrary = { path: null, error: "no C compiler" };
 * if (none.path !== null) throw new Error();
 * ```
 */
export type GateLibrary = { path: string; error: null } | { path: null; error: string };

/** The file name the build writes in its directory. */
const _GATE_LIBRARY_NAME = "libkcoral_gate.so";

/**
 * Builds the shim into `dir` with the worker interpreter `python`, whose module path must reach
 * the runtime (`runtimePath`); `env` is the workers' environment (`CC`, `PATH`). Never throws.
 *
 * @example
 * ```ts ignore
 * import { buildGateLibrary } from "./gate_library.ts";
 *
 * const gate = await buildGateLibrary("python3", "./runtime_py", "/tmp/kcoral-x/gate", {});
 * if (gate.path === null) console.error(`no GPU gate: ${gate.error}`);
 * ```
 */
export async function buildGateLibrary(
  python: string,
  runtimePath: string,
  dir: string,
  env: Record<string, string>,
): Promise<GateLibrary> {
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command(python, {
      args: ["-m", "kcoral_runtime.gate_shim", dir],
      env: {
        ...env,
        PYTHONPATH: [runtimePath, env.PYTHONPATH].filter(Boolean).join(":"),
        PYTHONDONTWRITEBYTECODE: "1",
      },
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
  } catch (error) {
    return { path: null, error: `cannot run ${python}: ${(error as Error).message}` };
  }
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes).trim();
  if (!output.success) {
    return { path: null, error: text(output.stderr) || `exit status ${output.code}` };
  }
  const path = text(output.stdout);
  if (!path.endsWith(`/${_GATE_LIBRARY_NAME}`)) {
    return { path: null, error: `the build printed no library path: ${path.slice(0, 200)}` };
  }
  return { path, error: null };
}
