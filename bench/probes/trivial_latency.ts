/**
 * Latency of a trivial program on a reused worker (two workers), without the rest of the server
 * bench: 400 requests, the first 50 as warm-up, median and p10. Quick enough to alternate two
 * trees in one VM (an A/B of the front-end's per-request cost). `bubblewrap` runs the workers
 * in the sandbox (default: none).
 *
 *   deno run -A bench/probes/trivial_latency.ts [gpu] [bubblewrap]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";

const server = await startReusedServer(2, {
  gpu: Deno.args.includes("gpu"),
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
  console.log(
    `trivial, reused${Deno.args.includes("bubblewrap") ? ", bubblewrap" : ""}: median ${
      ms[ms.length >> 1].toFixed(2)
    } ms, p10 ${ms[Math.floor(ms.length * 0.1)].toFixed(2)} ms`,
  );
} finally {
  await server.stop();
}
