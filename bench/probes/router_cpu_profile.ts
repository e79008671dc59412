/**
 * Where a Router's main thread spends a trivial routed request: for each checkout given, a
 * `kcoral router` from it under `--cpu-prof`, one node from it (2 reused CPU workers), `--requests`
 * trivial programs sent one after another through the Router after 200 untimed ones; then the
 * Router is stopped (SIGINT writes the profile) and the profile is read: wall time per request, the
 * main thread's non-idle time per request, and the functions with the most self time.
 *
 *   deno run -A bench/probes/router_cpu_profile.ts TREE [TREE ...] [--requests 3000] [--top 15]
 *
 * Time spent in Rust outside an op (e.g. `Deno.serve`'s parsing, a WebSocket's writes) shows as
 * "(idle)" or "(program)", not under a function, so compare totals across trees with that in mind.
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { trivialProgram } from "../_programs.ts";
import { freePort, startNodeProcess, waitForCapacity } from "../_routed.ts";
import { numberArg, positionalArgs } from "./_probe.ts";

interface _Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}

interface _Profile {
  nodes: _Node[];
  samples: number[];
  timeDeltas: number[];
}

/** Self time per function (ms), from a V8 `.cpuprofile`. */
function selfTimes(profile: _Profile): Map<string, number> {
  const names = new Map<number, string>();
  for (const { id, callFrame: f } of profile.nodes) {
    names.set(id, `${f.functionName || "(anonymous)"} ${f.url.split("/").at(-1)}:${f.lineNumber}`);
  }
  const times = new Map<string, number>();
  profile.samples.forEach((id, i) => {
    const name = names.get(id)!;
    times.set(name, (times.get(name) ?? 0) + profile.timeDeltas[i] / 1000);
  });
  return times;
}

const requests = numberArg("--requests", 3000);
const top = numberArg("--top", 15);
const program = trivialProgram();
for (const tree of positionalArgs()) {
  const dir = await Deno.makeTempDir();
  const port = freePort();
  const router = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--cpu-prof", `--cpu-prof-dir=${dir}`, `${tree}/cli.ts`, "router"]
      .concat(["--port", String(port), "--recovery-threshold", "1"]),
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const lines = router.stderr.pipeThrough(new TextDecoderStream()).getReader();
  for (let seen = ""; !seen.includes("listening");) seen += (await lines.read()).value ?? "";
  void (async () => {
    while (!(await lines.read()).done);
  })();
  const url = `http://127.0.0.1:${port}`;
  const node = await startNodeProcess("cpu", url, 2, tree);
  let wallMs = 0;
  try {
    await waitForCapacity(url, 2);
    const client = new Client(url);
    for (let i = 0; i < 200; i++) await client.execute(program);
    const start = performance.now();
    for (let i = 0; i < requests; i++) await client.execute(program);
    wallMs = performance.now() - start;
  } finally {
    router.kill("SIGINT");
    await router.status;
    await node.stop();
  }
  const [file] = [...Deno.readDirSync(dir)].filter((e) => e.name.endsWith(".cpuprofile"));
  const times = selfTimes(JSON.parse(await Deno.readTextFile(`${dir}/${file.name}`)));
  const all = requests + 200;
  const busy = [...times].filter(([name]) => !name.startsWith("(idle)"))
    .reduce((sum, [, ms]) => sum + ms, 0);
  console.log(
    `\n${tree}: ${(wallMs / requests).toFixed(3)} ms per request (wall), main thread not idle ${
      (busy / all).toFixed(3)
    } ms per request (${all} requests in the profile)\n`,
  );
  console.log("| function | ms per request |\n|---|---|");
  for (const [name, ms] of [...times].sort((a, b) => b[1] - a[1]).slice(0, top)) {
    console.log(`| ${name} | ${(ms / all).toFixed(4)} |`);
  }
}
