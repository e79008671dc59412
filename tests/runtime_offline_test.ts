/**
 * KCoral run from a remote URL needs the network only for its first load: the package is served
 * over a local HTTP server, `kcoral server` runs from that URL (`deno run -A http://…/cli.ts
 * server`) and serves a program, `kcoral run` from that URL runs a script, the HTTP server is
 * stopped, and then the node starts again (with its runtime cache and with an empty one) and
 * `kcoral run` runs again: the runtime's files are text imports that Deno's module cache keeps.
 *
 * The node runs with its own `DENO_DIR` (Deno's module cache, which keeps the code the way the
 * runtime cache keeps the Python files) and `--no-lock`, so nothing of the checkout's caches or
 * lock file changes; its npm dependencies come from the npm registry on the first start.
 */
import assert from "node:assert/strict";
import { readRuntimeFiles } from "../runtime_py/runtime_files.ts";
import { runtimeManifest } from "../server/runtime/runtime_manifest.ts";
import { callProgram, postProgram } from "./_server.ts";

const ROOT = new URL("../", import.meta.url);

/** Serves the checkout's files (the package as a registry or a web server would). */
function serveCheckout() {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const path = decodeURIComponent(new URL(request.url).pathname).slice(1);
    if (path.split("/").includes("..")) return new Response("", { status: 400 });
    try {
      const type = path.endsWith(".json") ? "application/json" : "application/typescript";
      return new Response(await Deno.readFile(new URL(path, ROOT)), {
        headers: { "content-type": type },
      });
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return { url: `http://127.0.0.1:${server.addr.port}/`, stop: () => server.shutdown() };
}

/** A `kcoral server` process run from `baseUrl`'s `cli.ts`; resolves once it is up (or exited). */
async function startNode(baseUrl: string, env: Record<string, string>, config: string) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--no-lock",
      `--config=${config}`,
      `${baseUrl}cli.ts`,
      "server",
      "--device",
      "cpu",
      "--sandbox",
      "none",
      "--port",
      String(port),
      "--log-dir",
      "",
      "--disk-cache-dir",
      "",
    ],
    env,
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let said = "";
  let exited = false;
  while (!said.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) {
      exited = true;
      break;
    }
    said += value;
  }
  const drain = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      said += value;
    }
  })();
  return {
    url: `http://127.0.0.1:${port}`,
    exited,
    said: () => said,
    async stop(): Promise<number> {
      if (!exited) child.kill("SIGTERM");
      const status = await child.status;
      await drain;
      return status.code;
    },
  };
}

/** Where the node's worker imported `kcoral_runtime` from, asked through a program. */
async function runtimeFile(url: string): Promise<string> {
  const answer = await postProgram(
    url,
    callProgram(
      "import kcoral_runtime\ndef where():\n    return kcoral_runtime.__file__\n",
      "where",
    ),
  );
  assert.equal(answer.status, 200, JSON.stringify(answer.json));
  assert.equal(answer.json.status, "COMPLETED", JSON.stringify(answer.json));
  return (answer.json.results as { out: { value: string } }).out.value;
}

/** `kcoral run python` from `baseUrl`'s `cli.ts` against `server`: its exit code and output. */
async function runFromUrl(
  baseUrl: string,
  env: Record<string, string>,
  config: string,
  server: string,
) {
  const output = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--no-lock",
      `--config=${config}`,
      `${baseUrl}cli.ts`,
      "run",
      "python",
      "--url",
      server,
      "--",
      "-c",
      "print(6 * 7)",
    ],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return { code: output.code, stdout: text(output.stdout), stderr: text(output.stderr) };
}

Deno.test("offline node: run from a URL, the server and kcoral run work with the URL gone", async () => {
  const HASH = runtimeManifest(await readRuntimeFiles()).hash;
  const scratch = await Deno.makeTempDir({ prefix: "kcoral-offline-test-" });
  const config = `${scratch}/deno.json`;
  const { imports } = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  await Deno.writeTextFile(config, JSON.stringify({ imports }));
  const cacheDir = `${scratch}/cache`;
  const env = {
    ...Deno.env.toObject(),
    DENO_DIR: `${scratch}/deno`,
    DENO_NO_UPDATE_CHECK: "1",
    KCORAL_CACHE_DIR: cacheDir,
  };
  const served = serveCheckout();
  let stopped = false;
  try {
    const first = await startNode(served.url, env, config);
    assert.ok(!first.exited, first.said());
    const cached = `${cacheDir}/runtime/${HASH}/kcoral_runtime/__init__.py`;
    assert.equal(await runtimeFile(first.url), cached);
    const online = await runFromUrl(served.url, env, config, first.url);
    assert.deepEqual([online.code, online.stdout], [0, "42\n"], online.stderr);
    assert.equal(await first.stop(), 0, first.said());

    await served.stop();
    stopped = true;
    const offline = await startNode(served.url, env, config);
    assert.ok(!offline.exited, `the node did not start without the server:\n${offline.said()}`);
    assert.equal(await runtimeFile(offline.url), cached);
    // kcoral run from the URL reads the tool runner from Deno's module cache, not the network.
    const run = await runFromUrl(served.url, env, config, offline.url);
    assert.deepEqual([run.code, run.stdout], [0, "42\n"], run.stderr);
    assert.equal(await offline.stop(), 0, offline.said());

    // No runtime cache either: the node writes the runtime from its module graph, offline.
    const emptyCache = `${scratch}/empty`;
    const fresh = await startNode(served.url, { ...env, KCORAL_CACHE_DIR: emptyCache }, config);
    assert.ok(!fresh.exited, `the node did not start without a runtime cache:\n${fresh.said()}`);
    assert.equal(
      await runtimeFile(fresh.url),
      `${emptyCache}/runtime/${HASH}/kcoral_runtime/__init__.py`,
    );
    assert.equal(await fresh.stop(), 0, fresh.said());
  } finally {
    if (!stopped) await served.stop();
    await Deno.remove(scratch, { recursive: true });
  }
});
