/**
 * The GPU gate's shim, built once when a GPU server starts (`python -m kcoral_runtime.gate_shim
 * DIR`, compiled with `cc`): with it, a script request's processes take the GPU lease at their
 * first CUDA call instead of for their whole life (docs/decisions/script-gpu-gate.md). Without a
 * compiler the server runs without the gate and says why.
 *
 * @module
 */

/** The outcome of {@linkcode buildGateLibrary}: the library's path, or why there is none. */
export type GateLibrary = { path: string; error: null } | { path: null; error: string };

const _GATE_LIBRARY_NAME = "libkcoral_gate.so";

/** Builds the shim into `dir` with the worker interpreter (`env`: `CC`, `PATH`); never throws. */
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
