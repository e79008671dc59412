/**
 * Where a routed request's CPU goes: a `kcoral router` and one node (`kcoral server --router`,
 * 8 reused workers) on loopback; 8 closed-loop clients of trivial programs for `seconds`
 * (default 5), alternating direct (the node's own port) and routed, three rounds; requests per
 * second and CPU per request of the Router process, of the node's server process and of its
 * workers (every process below the server), from /proc. With `DENO_V8_FLAGS=--prof` in the
 * environment every Deno process writes a V8 profile into the working directory
 * (`node --prof-process isolate-*.log`).
 *
 *   deno run -A bench/probes/router_closed_loop.ts [gpu] [--seconds S]
 *
 * @module
 */
import { closedLoop } from "../_load.ts";
import { trivialProgram } from "../_programs.ts";

const _CLI = new URL("../../cli.ts", import.meta.url).pathname;
const gpu = Deno.args.includes("gpu");
const at = Deno.args.indexOf("--seconds");
const seconds = at >= 0 ? Number(Deno.args[at + 1]) : 5;

function _freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** Parent pid and CPU ms (user + system) of every process, from /proc. */
function _processes(): Map<number, { parent: number; cpuMs: number }> {
  const table = new Map<number, { parent: number; cpuMs: number }>();
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      table.set(Number(entry.name), {
        parent: Number(fields[1]),
        cpuMs: (Number(fields[11]) + Number(fields[12])) * 10,
      });
    } catch { /* gone */ }
  }
  return table;
}

/** CPU ms of the Router, the node's server (the supervisor's child) and the server's workers. */
function _cpu(routerPid: number, supervisorPid: number) {
  const table = _processes();
  const server = [...table].find(([, p]) => p.parent === supervisorPid)?.[0] ?? -1;
  let workers = 0;
  for (const p of table.values()) {
    for (let up = p.parent; up > 1; up = table.get(up)?.parent ?? 0) {
      if (up === server) {
        workers += p.cpuMs;
        break;
      }
    }
  }
  return {
    router: table.get(routerPid)?.cpuMs ?? 0,
    server: table.get(server)?.cpuMs ?? 0,
    workers,
  };
}

function _spawn(args: string[]): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", _CLI, ...args],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}

const routerPort = _freePort();
const nodePort = _freePort();
const router = _spawn(["router", "--port", String(routerPort), "--recovery-threshold", "1"]);
const routerUrl = `http://127.0.0.1:${routerPort}`;
const device = gpu
  ? ["--device", "gpu", "--gpus", "0", "--workers-per-gpu", "8"]
  : ["--device", "cpu", "--num-workers", "8"];
const node = _spawn([
  "server",
  "--router",
  routerUrl,
  "--node-id",
  "probe",
  "--port",
  String(nodePort),
  ...device,
  "--sandbox",
  "none",
  "--max-requests-per-worker",
  "0",
  "--log-dir",
  "",
  "--no-log-console",
  "--disk-cache-dir",
  "",
]);
try {
  for (let i = 0;; i++) {
    try {
      const body = await (await fetch(`${routerUrl}/health`)).json();
      if (body.load.request_capacity >= 8) break;
    } catch { /* not up yet */ }
    if (i > 1200) throw new Error("the node did not join the Router");
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const program = trivialProgram();
  const direct = `http://127.0.0.1:${nodePort}`;
  await closedLoop(direct, program, 8, 1);
  await closedLoop(routerUrl, program, 8, 1);
  for (let round = 1; round <= 3; round++) {
    for (const [name, url] of [["direct", direct], ["routed", routerUrl]]) {
      const before = _cpu(router.pid, node.pid);
      const { rate, done } = await closedLoop(url, program, 8, seconds);
      const after = _cpu(router.pid, node.pid);
      const per = (key: "router" | "server" | "workers") =>
        ((after[key] - before[key]) / done).toFixed(3);
      console.log(
        `round ${round} ${name}: ${rate.toFixed(0)} req/s; CPU ms per request: Router ${
          per("router")
        }, node server ${per("server")}, workers ${per("workers")}`,
      );
    }
  }
} finally {
  for (const child of [node, router]) {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
    await child.status;
  }
}
