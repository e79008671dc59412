/**
 * The server's own NVML reading of GPUs, for the receipt of a request whose worker gave none: a
 * short-lived `python -m kcoral_runtime.gpu_receipt ID...` of the workers' interpreter, outside
 * any sandbox (docs/decisions/dead-worker-receipt.md).
 *
 * @module
 */

/** What {@linkcode readGpuState} got: the helper's report (unchecked), or why there is none. */
export type GpuStateReading =
  | { report: unknown; error?: undefined }
  | { report?: undefined; error: string };

/** How the helper is started. */
export interface GpuReadingCommand {
  /** The workers' Python interpreter. */
  python: string;
  /** The directory that holds the `kcoral_runtime` package (its `PYTHONPATH`). */
  runtimePath: string;
  /** The server's environment (`KCORAL_NVML_LIBRARY`, when set, picks the library). */
  env: Record<string, string>;
}

/** Longest wait for the helper, ms: past it the receipt says the reading took too long. */
export const GPU_READING_TIMEOUT_MS = 5_000;

/**
 * Reads the GPUs `ids` (UUIDs, or `sim-<k>`) in a new process; never rejects. A helper that fails,
 * prints no JSON or overruns `timeoutMs` is killed and its failure is the `error`.
 */
export async function readGpuState(
  ids: readonly string[],
  command: GpuReadingCommand,
  timeoutMs = GPU_READING_TIMEOUT_MS,
): Promise<GpuStateReading> {
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command(command.python, {
      args: ["-m", "kcoral_runtime.gpu_receipt", ...ids],
      env: { ...command.env, PYTHONPATH: command.runtimePath },
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  } catch (error) {
    return { error: `cannot start ${command.python}: ${(error as Error).message}` };
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(resolve, timeoutMs, "late")));
  const output = child.output();
  try {
    const ended = await Promise.race([output, late]);
    if (ended === "late") {
      try {
        child.kill("SIGKILL");
      } catch {
        // gone already
      }
      await output.catch(() => {});
      return { error: `the server's NVML reading took over ${timeoutMs} ms` };
    }
    const text = new TextDecoder().decode(ended.stdout).trim();
    if (!ended.success) {
      const why = new TextDecoder().decode(ended.stderr).trim().split("\n").at(-1) ?? "";
      return { error: `the server's NVML reading exited with ${ended.code}: ${why}` };
    }
    try {
      return { report: JSON.parse(text) };
    } catch {
      return { error: "the server's NVML reading printed no JSON" };
    }
  } finally {
    clearTimeout(timer);
  }
}
