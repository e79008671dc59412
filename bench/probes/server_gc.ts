/**
 * The server process's garbage collections (V8 `--trace-gc`) during 8 cached 64 MiB requests,
 * on a fresh server and again after 15 s of 8 clients sending trivial requests (simulated GPUs).
 * The trace is read after the server exits (its output is block-buffered) and each collection is
 * placed in a phase by its time.
 *
 *   deno run -A bench/probes/server_gc.ts
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { randomAddProgram, startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";

const server = await startReusedServer(8, { denoFlags: ["--v8-flags=--trace-gc"] });
const program = randomAddProgram();
const trivial = trivialProgram();
const phases: { label: string; from: number; to: number; times: number[] }[] = [];

async function phase(label: string, client: Client) {
  const times: number[] = [];
  const from = performance.now() - server.spawnedAt;
  for (let k = 0; k < 8; k++) {
    const start = performance.now();
    await client.execute(program);
    times.push(performance.now() - start);
  }
  phases.push({ label, from, to: performance.now() - server.spawnedAt, times });
}

{
  await using client = new Client(server.url);
  await phase("fresh server", client);
  const clients = Array.from({ length: 8 }, () => new Client(server.url));
  const end = performance.now() + 15_000;
  let count = 0;
  await Promise.all(clients.map(async (c) => {
    while (performance.now() < end) {
      await c.execute(trivial);
      count++;
    }
  }));
  for (const c of clients) c.close();
  console.log(`trivial requests in between: ${count}`);
  await phase("after load", client);
}
await server.stop();
const collections = server.stdout.join("").split("\n").flatMap((line) => {
  const match =
    / (\d+) ms: (Scavenge|Mark-Compact|Incremental Mark-Compact|Mark-Compact \(reduce\)|Incremental Mark-Compact \(reduce\)) .*?([\d.]+) \(([\d.]+)\) MB, (?:pooled: [\d.]+ MB, )?([\d.]+) \//
      .exec(line);
  return match
    ? [{ at: Number(match[1]), kind: match[2], heap: Number(match[3]), pause: Number(match[5]) }]
    : [];
});
for (const { label, from, to, times } of phases) {
  const inside = collections.filter((c) => c.at >= from - 200 && c.at <= to + 200);
  const pauses = inside.map((c) => c.pause);
  console.log(
    `${label}: 64 MiB ${times.map((x) => x.toFixed(0)).join(" ")} ms | ${inside.length} GCs, ` +
      `pauses ${pauses.reduce((a, b) => a + b, 0).toFixed(1)} ms in all, longest ${
        Math.max(0, ...pauses).toFixed(1)
      }, heap before the last ${inside.at(-1)?.heap ?? "-"} MB`,
  );
}
