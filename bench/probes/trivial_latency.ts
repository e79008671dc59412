/**
 * Latency of a trivial program on a reused worker (two workers), without the rest of the server
 * bench: 400 requests, the first 50 as warm-up, median and p10 end to end, and beside them the
 * medians of what the server's `request_finished` records say of the same requests: on the
 * worker (`elapsed_ms`, from `run` sent to its outcome) and holding the GPU's lease
 * (`lease_held_ms`); end to end minus on the worker is the front-end's and the client's share.
 * Quick enough to alternate two trees in one VM (an A/B of the per-request cost). `bubblewrap`
 * runs the workers in the sandbox (default: none).
 *
 *   deno run -A bench/probes/trivial_latency.ts [gpu] [bubblewrap]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { median, startReusedServer } from "./_probe.ts";
import { readEvents } from "../_server_state.ts";
import { trivialProgram } from "../_programs.ts";

const logDir = await Deno.makeTempDir({ prefix: "kcoral-trivial-" });
const server = await startReusedServer(2, {
  gpu: Deno.args.includes("gpu"),
  logDir,
  extra: Deno.args.includes("bubblewrap") ? ["--sandbox", "bubblewrap"] : [],
});
try {
  await using client = new Client(server.url);
  const program = trivialProgram();
  const ms: number[] = [];
  for (let i = 0; i < 400; i++) {
    const start = performance.now();
    await client.execute(program);
    if (i >= 50) ms.push(performance.now() - start);
  }
  ms.sort((a, b) => a - b);
  await server.stop(); // its event log is complete once it has exited
  const finished = (await readEvents(logDir)).filter((e) => e.event === "request_finished")
    .slice(50);
  const field = (name: string) => median(finished.map((e) => Number(e[name]))).toFixed(2);
  console.log(
    `trivial, reused${Deno.args.includes("bubblewrap") ? ", bubblewrap" : ""}: median ${
      ms[ms.length >> 1].toFixed(2)
    } ms, p10 ${ms[Math.floor(ms.length * 0.1)].toFixed(2)} ms; on the worker ${
      field("elapsed_ms")
    } ms, lease held ${field("lease_held_ms")} ms`,
  );
} finally {
  await server.stop();
  await Deno.remove(logDir, { recursive: true });
}
