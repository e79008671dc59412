/**
 * Does the server's heap grow with the requests it served? The heap left by the last garbage
 * collection (V8 `--trace-gc`, read once the server has exited) at the end of each of four 8 s
 * phases of 4 clients (simulated GPUs).
 * `HEALTH=1` sends `GET /health` instead of trivial programs; extra arguments go to the server
 * (e.g. `--max-requests-per-worker 1`).
 *
 *   deno run -A bench/probes/server_heap.ts [server flags]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";

const server = await startReusedServer(4, {
  extra: Deno.args,
  denoFlags: ["--v8-flags=--trace-gc"],
});
const trivial = trivialProgram();
const health = Deno.env.get("HEALTH") !== undefined;
const marks: { requests: number; at: number }[] = [];
let total = 0;
for (let phase = 0; phase < 4; phase++) {
  const clients = Array.from({ length: 4 }, () => new Client(server.url));
  const end = performance.now() + 8000;
  await Promise.all(clients.map(async (c) => {
    while (performance.now() < end) {
      if (health) await c.health();
      else await c.execute(trivial);
      total++;
    }
  }));
  for (const c of clients) c.close();
  marks.push({ requests: total, at: performance.now() - server.spawnedAt });
}
await server.stop(); // its output is block-buffered: read the trace once it has exited
const collections = server.stdout.join("").split("\n").flatMap((line) => {
  const match = / (\d+) ms: ([A-Za-z -]+?) [\d.]+ \([\d.]+\) -> ([\d.]+) \([\d.]+\) MB/.exec(line);
  return match ? [{ at: Number(match[1]), kind: match[2], after: Number(match[3]) }] : [];
});
for (const { requests, at } of marks) {
  const last = collections.filter((c) => c.at <= at).at(-1);
  console.log(
    `after ${requests} requests: ${last ? `${last.kind} left ${last.after} MB` : "no GC yet"}`,
  );
}
