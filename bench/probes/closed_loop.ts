/**
 * Throughput of trivial programs on reused workers, without the rest of the server bench:
 * `clients` (default 8) closed-loop clients for `seconds` (default 5) against 8 reused workers,
 * three rounds, requests per second each. Quick enough to alternate two trees in one VM (an A/B
 * of the per-request cost under load, which the single-client latency probe does not show).
 *
 *   deno run -A bench/probes/closed_loop.ts [gpu] [--clients N] [--seconds S]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { startReusedServer, trivialProgram } from "./_probe.ts";

function _flag(name: string, fallback: number): number {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Number(Deno.args[at + 1]) : fallback;
}

const clients = _flag("--clients", 8);
const seconds = _flag("--seconds", 5);
const server = await startReusedServer(8, { gpu: Deno.args.includes("gpu") });
try {
  const program = trivialProgram();
  const rates: number[] = [];
  for (let round = 0; round < 3; round++) {
    const deadline = performance.now() + seconds * 1000;
    let done = 0;
    const start = performance.now();
    await Promise.all(Array.from({ length: clients }, async () => {
      await using client = new Client(server.url);
      while (performance.now() < deadline) {
        const result = await client.execute(program);
        if (!result.completed) throw new Error(JSON.stringify(result.error));
        done++;
      }
    }));
    rates.push(done / ((performance.now() - start) / 1000));
  }
  console.log(
    `closed loop, ${clients} clients: ${rates.map((r) => r.toFixed(0)).join(" / ")} req/s`,
  );
} finally {
  await server.stop();
}
