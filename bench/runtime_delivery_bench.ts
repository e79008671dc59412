/**
 * How the Python runtime's files reach `kcoral run` and `kcoral server` when KCoral runs from a
 * URL (as from a registry): `kcoral run` latency and a server's start, from a URL and from the
 * checkout (the anchor), for one or two trees of the code side by side.
 *
 * ```sh
 * git archive <old-commit> | (mkdir -p /tmp/kc-before && tar -x -C /tmp/kc-before)
 * deno run -A bench/runtime_delivery_bench.ts --tree before=/tmp/kc-before --tree after=. \
 *   [--rtt-ms 30] [--runs 7]
 * ```
 *
 * Each tree is served over loopback HTTP; every file request waits `--rtt-ms` first, standing in
 * for a registry's round trip (jsr.io is farther than loopback). Each tree gets its own `DENO_DIR`,
 * warmed by one untimed run of each command, so the rows show the steady state a user sees after
 * the first call: what Deno's module cache keeps, and what the code still fetches per call. The
 * measurements alternate between the trees (one of each per round), so a shared machine's load
 * falls on both alike.
 * `kcoral run python -- -c pass` targets one local CPU server started from this checkout.
 * Rows: wall time of the whole CLI process; a server's start is spawn → `Application startup
 * complete.` with an empty runtime cache (`KCORAL_CACHE_DIR`) and with the cache of the run before.
 *
 * @module
 */
import { row, table } from "./_stats.ts";

const arg = (name: string, fallback: string) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : fallback;
};
const trees: [string, string][] = [];
for (let i = 0; i < Deno.args.length; i++) {
  if (Deno.args[i] !== "--tree") continue;
  const [label, dir] = Deno.args[i + 1].split("=");
  trees.push([label, await Deno.realPath(dir)]);
}
if (trees.length === 0) trees.push(["this tree", await Deno.realPath(".")]);
const rttMs = Number(arg("--rtt-ms", "30"));
const runs = Number(arg("--runs", "7"));
const CHECKOUT = decodeURIComponent(new URL("../", import.meta.url).pathname);

/** Serves `root`'s files over loopback, each answer after `rttMs`. */
function serveTree(root: string) {
  let requests = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    requests++;
    await new Promise((r) => setTimeout(r, rttMs));
    const path = decodeURIComponent(new URL(request.url).pathname);
    if (path.split("/").includes("..")) return new Response("", { status: 400 });
    try {
      const type = path.endsWith(".json") ? "application/json" : "application/typescript";
      return new Response(await Deno.readFile(`${root}${path}`), {
        headers: { "content-type": type },
      });
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}/`,
    get requests() {
      return requests;
    },
    stop: () => server.shutdown(),
  };
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** Wall ms of one process run to its end (it must succeed). */
async function timed(args: string[], env: Record<string, string>): Promise<number> {
  const start = performance.now();
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    env,
    stdout: "null",
    stderr: "piped",
  })
    .output();
  const ms = performance.now() - start;
  if (!output.success) {
    throw new Error(`${args.join(" ")} failed:\n${new TextDecoder().decode(output.stderr)}`);
  }
  return ms;
}

/** The stdout of a process run to its end (it must succeed), trimmed. */
async function _stdout(args: string[], env: Record<string, string>): Promise<string> {
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) throw new Error(new TextDecoder().decode(output.stderr));
  return new TextDecoder().decode(output.stdout).trim();
}

/**
 * Ms from spawning a server to its `Application startup complete.`; then stops it. A port taken
 * between choosing it and binding it (other processes share the machine) is tried again.
 */
async function serverStartMs(main: string, extra: string[], env: Record<string, string>) {
  for (let attempt = 0;; attempt++) {
    try {
      return await _serverStartMs(main, extra, env);
    } catch (error) {
      if (attempt >= 3 || !String(error).includes("Address already in use")) throw error;
    }
  }
}

async function _serverStartMs(main: string, extra: string[], env: Record<string, string>) {
  const start = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      ...extra,
      main,
      "server",
      "--device",
      "cpu",
      "--sandbox",
      "none",
      "--num-workers",
      "1",
      "--port",
      String(freePort()),
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
  while (!said.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the server exited:\n${said}`);
    said += value;
  }
  const ms = performance.now() - start;
  child.kill("SIGTERM");
  await reader.cancel();
  await child.status;
  return ms;
}

const scratch = await Deno.makeTempDir({ prefix: "kcoral-runtime-bench-" });
const baseEnv = { ...Deno.env.toObject(), DENO_NO_UPDATE_CHECK: "1" };
const target = freePort();
const local = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    `${CHECKOUT}cli.ts`,
    "server",
    "--device",
    "cpu",
    "--sandbox",
    "none",
    "--port",
    String(target),
    "--log-dir",
    "",
  ],
  stdout: "null",
  stderr: "null",
}).spawn();
const rows = [];
try {
  for (
    let i = 0;
    !(await fetch(`http://127.0.0.1:${target}/health`).then((r) => r.ok, () => false));
    i++
  ) {
    if (i > 600) throw new Error("the target server did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  const runArgs = ["run", "python", "--url", `http://127.0.0.1:${target}`, "--", "-c", "pass"];
  // Every tree served and warmed first; then each measurement alternates between the trees, so
  // a change of the machine's load lands on all of them alike.
  const setups = [];
  for (const [label, root] of trees) {
    const served = serveTree(root);
    const config = `${scratch}/${label}.json`;
    const { imports } = JSON.parse(await Deno.readTextFile(`${root}/deno.json`));
    await Deno.writeTextFile(config, JSON.stringify({ imports }));
    const env = { ...baseEnv, DENO_DIR: `${scratch}/deno-${label}` };
    const extra = ["--no-lock", `--config=${config}`];
    // Warm Deno's module cache (code, npm packages, whatever the code imports) once.
    await timed(["run", "-A", ...extra, `${served.url}cli.ts`, ...runArgs], env);
    await serverStartMs(`${served.url}cli.ts`, extra, { ...env, KCORAL_CACHE_DIR: `${scratch}/w` });
    // In a fresh process from the URL: the time `kcoral run` spends getting the runner's and the
    // tool's Python sources (a fetch per file before, Deno's module cache after).
    const probe = `${scratch}/sources-${label}.ts`;
    await Deno.writeTextFile(
      probe,
      `import { readToolSources } from "${served.url}cli/run/sources.ts";\n` +
        "const start = performance.now();\n" +
        'const { runner, definition } = await readToolSources("python");\n' +
        "const ms = performance.now() - start;\n" +
        'if (!runner.includes("def run(") || !definition.includes("def run(")) throw new Error();\n' +
        "console.log(ms);\n",
    );
    await _stdout(["run", "-A", ...extra, probe], env);
    setups.push({
      label,
      root,
      served,
      env,
      extra,
      probe,
      sources: [] as number[],
      run: [] as number[],
      cold: [] as number[],
      warm: [] as number[],
      inPlace: [] as number[],
      startInPlace: [] as number[],
      runRequests: 0,
      startRequests: 0,
    });
  }
  for (let i = 0; i < runs; i++) {
    for (const s of setups) {
      s.sources.push(Number(await _stdout(["run", "-A", ...s.extra, s.probe], s.env)));
      const before = s.served.requests;
      s.run.push(
        await timed(["run", "-A", ...s.extra, `${s.served.url}cli.ts`, ...runArgs], s.env),
      );
      s.runRequests += s.served.requests - before;
      const env2 = { ...s.env, KCORAL_CACHE_DIR: `${scratch}/cache-${s.label}-${i}` };
      const started = s.served.requests;
      s.cold.push(await serverStartMs(`${s.served.url}cli.ts`, s.extra, env2));
      s.startRequests += s.served.requests - started;
      s.warm.push(await serverStartMs(`${s.served.url}cli.ts`, s.extra, env2));
      // The anchor: the same tree's checkout, read in place.
      s.inPlace.push(await timed(["run", "-A", `${s.root}/cli.ts`, ...runArgs], baseEnv));
      s.startInPlace.push(await serverStartMs(`${s.root}/cli.ts`, [], baseEnv));
    }
  }
  for (const s of setups) {
    await s.served.stop();
    const label = s.label;
    rows.push(
      row(
        `${label}: kcoral run from a URL (${s.runRequests / runs} HTTP requests/run)`,
        "ms",
        s.run,
      ),
    );
    rows.push(row(`${label}: kcoral run from the checkout (anchor)`, "ms", s.inPlace));
    rows.push(
      row(`${label}: the tool's Python sources, from a URL, in a fresh process`, "ms", s.sources),
    );
    rows.push(
      row(
        `${label}: server start from a URL, empty runtime cache (${
          s.startRequests / runs
        } HTTP requests/start)`,
        "ms",
        s.cold,
      ),
    );
    rows.push(row(`${label}: server start from a URL, runtime cached`, "ms", s.warm));
    rows.push(row(`${label}: server start from the checkout (anchor)`, "ms", s.startInPlace));
  }
} finally {
  local.kill("SIGTERM");
  await local.status;
  await Deno.remove(scratch, { recursive: true });
}
console.log(
  `## Runtime delivery from a URL (${rttMs} ms per file request, ${runs} runs, ${
    new Date().toISOString()
  })\n`,
);
console.log(table(rows));
