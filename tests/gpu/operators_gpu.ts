/**
 * On the GPU machine: what an operator of a GPU server sees (issue 42). A real GPU server's
 * /metrics has kcoral_build_info with the workers' torch and CUDA versions, prom-client's process
 * metrics, kcoral_request_duration_seconds{gpu="0"} after a program that ran on GPU 0 and
 * kcoral_request_capacity; /status/data names the version; a server run from an HTTP URL (the
 * package served from this checkout, as a registry would) writes the Python runtime into an empty
 * KCORAL_CACHE_DIR from its module graph and runs a CUDA program with it.
 *
 * ```sh
 * deno run -A tests/gpu/operators_gpu.ts      # prints PASS/FAIL lines, exit 1 on a failure
 * ```
 *
 * @module
 */
import { Client, Program } from "../../client/mod.ts";
import { KCORAL_VERSION } from "../../options/version.ts";

const ROOT = decodeURIComponent(new URL("../../", import.meta.url).pathname);
let failed = 0;
const check = (name: string, ok: boolean, detail = "") => {
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
  if (!ok) failed++;
};

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** A `kcoral server --device gpu --gpus 0` from `main` (a path or URL); resolves once it is up. */
async function startGpuServer(main: string, extra: string[], env: Record<string, string>) {
  const port = freePort();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      ...extra,
      main,
      "server",
      "--device",
      "gpu",
      "--gpus",
      "0",
      "--port",
      String(port),
      "--log-dir",
      "",
      "--num-workers",
      "1",
    ],
    env,
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let said = "";
  while (!said.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the server exited:\n${said}`);
    said += value;
  }
  void (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })();
  return {
    url: `http://127.0.0.1:${port}`,
    async stop() {
      child.kill("SIGTERM");
      await child.status;
    },
  };
}

function cudaProgram(): Program {
  const program = new Program();
  const module = program.upload({
    kind: "module",
    source:
      "import torch\ndef f():\n    x = torch.ones(4, device='cuda')\n    return float((x + 1).sum())\n",
  });
  program.return_({
    key: "y",
    value: program.run({ fn: program.getFunction({ module, name: "f" }) }),
  });
  return program;
}

const local = await startGpuServer(`${ROOT}cli.ts`, [], Deno.env.toObject());
try {
  await using client = new Client(local.url);
  const result = await client.execute(cudaProgram(), { timeoutSeconds: 120 });
  check(
    "a CUDA program runs",
    result.completed && result.get("y") === 8,
    String(result.error?.message ?? ""),
  );
  const text = await (await fetch(`${local.url}/metrics`)).text();
  const build = /^kcoral_build_info\{([^}]*)\} 1$/m.exec(text)?.[1] ?? "";
  check("kcoral_build_info has the version", build.includes(`version="${KCORAL_VERSION}"`), build);
  check(
    "kcoral_build_info has torch and CUDA",
    /torch="[^"]+"/.test(build) && /cuda="[^"]+"/.test(build),
    build,
  );
  check("process_open_fds", /^process_open_fds \d+$/m.test(text));
  check("process_resident_memory_bytes", /^process_resident_memory_bytes \d+$/m.test(text));
  const duration = /^kcoral_request_duration_seconds_count\{gpu="0"\} (\d+)$/m.exec(text);
  check(
    'kcoral_request_duration_seconds{gpu="0"}',
    Number(duration?.[1]) >= 1,
    duration?.[0] ?? "absent",
  );
  check("kcoral_request_capacity", /^kcoral_request_capacity \d+$/m.test(text));
  const status = await (await fetch(`${local.url}/status/data`)).json();
  check(
    "/status/data names the version",
    status.version === KCORAL_VERSION,
    String(status.version),
  );
} finally {
  await local.stop();
}

// From a URL, with an empty runtime cache: the runtime comes from the module graph.
const scratch = await Deno.makeTempDir({ prefix: "kcoral-operators-gpu-" });
const files = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
  const path = decodeURIComponent(new URL(request.url).pathname);
  if (path.split("/").includes("..")) return new Response("", { status: 400 });
  try {
    return new Response(await Deno.readFile(`${ROOT}${path.slice(1)}`), {
      headers: { "content-type": "application/typescript" },
    });
  } catch {
    return new Response("", { status: 404 });
  }
});
try {
  const { imports } = JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));
  await Deno.writeTextFile(`${scratch}/deno.json`, JSON.stringify({ imports }));
  const remote = await startGpuServer(
    `http://127.0.0.1:${files.addr.port}/cli.ts`,
    ["--no-lock", `--config=${scratch}/deno.json`],
    { ...Deno.env.toObject(), KCORAL_CACHE_DIR: `${scratch}/cache` },
  );
  try {
    await using client = new Client(remote.url);
    const result = await client.execute(cudaProgram(), { timeoutSeconds: 120 });
    check(
      "from a URL: a CUDA program runs",
      result.completed && result.get("y") === 8,
      String(result.error?.message ?? ""),
    );
    const written = [...Deno.readDirSync(`${scratch}/cache/runtime`)].map((e) => e.name);
    check(
      "from a URL: the runtime was written into the cache",
      written.length === 1,
      written.join(),
    );
  } finally {
    await remote.stop();
  }
} finally {
  await files.shutdown();
  await Deno.remove(scratch, { recursive: true });
}
console.log(failed === 0 ? "RESULT all passed" : `RESULT ${failed} failed`);
Deno.exit(failed === 0 ? 0 : 1);
