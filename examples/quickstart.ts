/**
 * Quickstart: starts a local KCoral server (on the GPU when one is visible, on the CPU
 * otherwise), sends a first program through the TypeScript client, prints the result, and
 * stops the server. It installs nothing: it needs Python 3 with numpy (`KCORAL_PYTHON` names
 * another interpreter) and says how to get it when that is missing.
 *
 * ```sh
 * deno task -q quickstart
 * ```
 *
 * @module
 */
import { Client, createApp, Program, serve, type Tensor } from "../mod.ts";

const python = Deno.env.get("KCORAL_PYTHON") || "python3";
const missing = await _missingPython(python);
if (missing) {
  console.error(`quickstart: ${missing}`);
  console.error(
    "  Debian/Ubuntu: sudo apt-get install python3-numpy   any system: python3 -m pip install numpy\n" +
      "  (or point KCORAL_PYTHON at an interpreter that has numpy; `deno task setup` installs " +
      "everything the tests need)",
  );
  Deno.exit(1);
}
const gpu = await _gpuVisible();
const app = createApp({
  python,
  device: gpu ? "gpu" : "cpu",
  gpus: [0],
  workersPerGpu: 2,
  numWorkers: 2,
  logDir: null,
  logConsole: false,
});
console.log(`Starting a local ${gpu ? "GPU" : "CPU"} server ...`);
const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
try {
  await using client = new Client(server.url);
  const health = await client.health();
  console.log(`Server ready at ${server.url}: target ${JSON.stringify(health.target)}`);

  const program = new Program();
  const module = program.upload({
    kind: "module",
    source: [
      "import numpy as np",
      "",
      "def add_one(x):",
      "    print('worker: adding one to', tuple(x.shape))",
      "    return x + 1",
      "",
      "def add_one_bytes(raw):",
      "    x = np.frombuffer(raw, dtype=np.float32)",
      "    print('worker: adding one to', x.shape)",
      "    return (x + 1).astype(np.float32).tobytes()",
      "",
    ].join("\n"),
  });
  const values = new Float32Array([1, 2, 3, 4]);
  let output;
  if (gpu) {
    // A tensor upload lands on the worker's GPU; the returned tensor comes back to the client.
    const x = program.upload({ kind: "tensor", value: values, shape: [4] });
    const fn = program.getFunction({ module, name: "add_one" });
    output = program.run({ fn, args: [x] });
  } else {
    // CPU servers take no tensor uploads; send the same float32 bytes as a bytes blob.
    const x = program.upload({ kind: "bytes", value: new Uint8Array(values.buffer) });
    const fn = program.getFunction({ module, name: "add_one_bytes" });
    output = program.run({ fn, args: [x] });
  }
  program.return_({ key: "y", value: output });

  const result = await client.execute(program, { timeoutSeconds: 60 });
  if (!result.completed) {
    console.error(`Program failed: ${result.error?.kind}: ${result.error?.message}`);
    Deno.exitCode = 1;
  } else {
    const y = result.get("y") as Tensor | Uint8Array;
    const data = y instanceof Uint8Array ? new Float32Array(y.slice().buffer) : y.data;
    console.log(`Input:  [${[...values].join(", ")}]`);
    console.log(`Output: [${[...(data as Float32Array)].join(", ")}]`);
    console.log(`Worker stdout: ${result.stdout.trim()}`);
    console.log(
      `Timings: queue ${result.queueMs.toFixed(1)} ms, on the worker ${
        result.elapsedMs.toFixed(1)
      } ms (GPU lease held ${result.leaseHeldMs.toFixed(1)} ms)`,
    );
    if (!gpu) {
      console.log(
        "No GPU is visible here, so this ran on a CPU server; tensors need a GPU server.",
      );
    }
  }
} finally {
  await server.shutdown();
  console.log("Server stopped.");
}

/** Why `python` cannot run the quickstart's workers, or `null` when it can. */
async function _missingPython(python: string): Promise<string | null> {
  try {
    const probe = await new Deno.Command(python, {
      args: ["-c", "import sys, numpy; assert sys.version_info >= (3, 9)"],
      stdout: "null",
      stderr: "null",
    }).output();
    return probe.success ? null : `${python} has no numpy (or is older than Python 3.9)`;
  } catch {
    return `${python} was not found: the workers need Python 3.9+ with numpy`;
  }
}

async function _gpuVisible(): Promise<boolean> {
  try {
    const output = await new Deno.Command("nvidia-smi", {
      args: ["-L"],
      stdout: "piped",
      stderr: "null",
    })
      .output();
    return output.success && new TextDecoder().decode(output.stdout).includes("GPU 0");
  } catch {
    return false;
  }
}
