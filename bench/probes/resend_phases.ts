/**
 * The cache-miss resend of a 64 MiB `c = a + b` (two new 64 MiB inputs): miss and hit times,
 * the resend cost per MiB, and the miss request's timeline from the server's events (ms from
 * the client's call; ms resolution): the first attempt's CACHE_MISS answer, the resend's
 * arrival, its receive/parse/store split, routing, the response being ready, and the worker's
 * `elapsed_ms`.
 *
 *   deno run -A bench/probes/resend_phases.ts [gpu]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { randomAddProgram, requestEvents, startReusedServer } from "./_probe.ts";

const logDir = await Deno.makeTempDir();
const server = await startReusedServer(2, { gpu: Deno.args.includes("gpu"), logDir });
const misses: { at: number; ms: number; elapsed: number; requestId: string }[] = [];
{
  await using client = new Client(server.url);
  for (let k = 0; k < 5; k++) {
    const program = randomAddProgram();
    const at = Date.now();
    let start = performance.now();
    const result = await client.execute(program);
    const miss = performance.now() - start;
    misses.push({ at, ms: miss, elapsed: result.elapsedMs, requestId: result.requestId });
    start = performance.now();
    await client.execute(program);
    const hit = performance.now() - start;
    console.log(
      `miss ${miss.toFixed(0)} hit ${hit.toFixed(0)} resend ${
        ((miss - hit) / 128).toFixed(2)
      } ms/MiB`,
    );
  }
}
await server.stop();
const byRequest = requestEvents(logDir);
const all = [...byRequest.values()].flat();
for (const { at, ms, elapsed, requestId } of misses) {
  const when = (e: Record<string, unknown>) => Date.parse(e.timestamp as string) - at;
  const missAnswer = all.find((e) =>
    e.event === "request_finished" && e.finish_reason === "cache_miss" && when(e) >= 0 &&
    when(e) <= ms
  );
  const events = byRequest.get(requestId) ?? [];
  const find = (name: string) => events.find((e) => e.event === name);
  const accepted = find("request_accepted");
  const n = (key: string) => Number(accepted?.[key]).toFixed(1);
  const t = (e: Record<string, unknown> | undefined) => (e ? `+${when(e)}` : "?");
  console.log(
    `total ${ms.toFixed(0)} | miss answered ${t(missAnswer)} | resend received ${
      t(find("request_received"))
    } (receive ${n("receive_ms")} parse ${n("parse_ms")} store ${n("store_ms")}) accepted ${
      t(accepted)
    } routed ${t(find("request_routed"))} ready ${t(find("request_finished"))} | worker ${
      elapsed.toFixed(1)
    }`,
  );
}
