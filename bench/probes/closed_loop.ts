/**
 * Throughput of trivial programs on reused workers, without the rest of the server bench:
 * `clients` (default 8) closed-loop clients for `seconds` (default 5) against 8 reused workers,
 * three rounds, requests per second each, and the CPU time per request of the server process
 * (the front-end) and of its workers (every process below it), from /proc; `bubblewrap` runs
 * the workers in the sandbox (default: none). Quick enough to
 * alternate two trees in one VM (an A/B of the per-request cost under load, which the
 * single-client latency probe does not show).
 *
 *   deno run -A bench/probes/closed_loop.ts [gpu] [bubblewrap] [--clients N] [--seconds S]
 *
 * @module
 */
import { closedLoop } from "../_load.ts";
import { processCpuMs } from "../_proc.ts";
import { startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";

function _flag(name: string, fallback: number): number {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Number(Deno.args[at + 1]) : fallback;
}

const clients = _flag("--clients", 8);
const seconds = _flag("--seconds", 5);
const server = await startReusedServer(8, {
  gpu: Deno.args.includes("gpu"),
  extra: Deno.args.includes("bubblewrap") ? ["--sandbox", "bubblewrap"] : [],
});
try {
  const program = trivialProgram();
  const rates: number[] = [];
  const frontMs: number[] = [];
  const workerMs: number[] = [];
  for (let round = 0; round < 3; round++) {
    const before = processCpuMs(server.child.pid);
    const { rate, done } = await closedLoop(server.url, program, clients, seconds);
    rates.push(rate);
    const after = processCpuMs(server.child.pid);
    frontMs.push((after.own - before.own) / done);
    workerMs.push((after.below - before.below) / done);
  }
  const list = (xs: number[], digits: number) => xs.map((x) => x.toFixed(digits)).join(" / ");
  console.log(
    `closed loop, ${clients} clients: ${list(rates, 0)} req/s; CPU per request: front-end ${
      list(frontMs, 3)
    } ms, workers ${list(workerMs, 3)} ms`,
  );
} finally {
  await server.stop();
}
