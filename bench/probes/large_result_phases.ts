/**
 * Where a cached 64 MiB `c = a + b` spends its time, through `Client.execute` against a server in
 * its own process: per request the total, the server's event times (from the client's start) and
 * the worker's `elapsed_ms`; "after finished" is the response's streaming and the client's
 * receiving and verifying.
 *
 *   deno run -A bench/probes/large_result_phases.ts [gpu] [--workers N]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { randomAddProgram, requestEvents, startReusedServer } from "./_probe.ts";

const gpu = Deno.args.includes("gpu");
const workers = Deno.args.includes("--workers")
  ? Deno.args[Deno.args.indexOf("--workers") + 1]
  : "2";
const logDir = await Deno.makeTempDir();
const server = await startReusedServer(workers, { gpu, logDir });
const program = randomAddProgram();
const starts: number[] = [];
const totals: number[] = [];
const elapsed: number[] = [];
{
  await using client = new Client(server.url);
  await client.execute(program);
  for (let k = 0; k < 8; k++) {
    starts.push(Date.now());
    const start = performance.now();
    const result = await client.execute(program);
    totals.push(performance.now() - start);
    elapsed.push(result.elapsedMs);
  }
}
await server.stop();
const requests = [...requestEvents(logDir).values()].slice(-8);
requests.forEach((events, k) => {
  const at = (name: string) => {
    const event = events.find((e) => e.event === name);
    return event ? Date.parse(event.timestamp as string) - starts[k] : NaN;
  };
  const worker = events.find((e) => e.event === "request_routed")?.worker_id;
  console.log(
    `total ${totals[k].toFixed(1)} | received +${at("request_received")} routed +${
      at("request_routed")
    } finished +${at("request_finished")} | worker ${worker} elapsed ${
      elapsed[k].toFixed(1)
    } | after finished ${(totals[k] - at("request_finished")).toFixed(0)}`,
  );
});
