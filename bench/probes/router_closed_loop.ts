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
import { childPid, ownCpuMs, processCpuMs } from "../_proc.ts";
import { trivialProgram } from "../_programs.ts";
import { startNodeProcess, startRouterProcess, waitForCapacity } from "../_routed.ts";

const at = Deno.args.indexOf("--seconds");
const seconds = at >= 0 ? Number(Deno.args[at + 1]) : 5;

/** CPU ms of the Router, the node's server (the supervisor's child) and the server's workers. */
function _cpu(routerPid: number, supervisorPid: number) {
  const server = childPid(supervisorPid) ?? -1;
  const { own, below } = processCpuMs(server);
  return { router: ownCpuMs(routerPid), server: own, workers: below };
}

const router = await startRouterProcess();
const node = await startNodeProcess(Deno.args.includes("gpu") ? "gpu" : "cpu", router.url, 8);
try {
  await waitForCapacity(router.url, 8);
  const program = trivialProgram();
  await closedLoop(node.url, program, 8, 1);
  await closedLoop(router.url, program, 8, 1);
  for (let round = 1; round <= 3; round++) {
    for (const [name, url] of [["direct", node.url], ["routed", router.url]]) {
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
  await node.stop();
  await router.stop();
}
