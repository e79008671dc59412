/**
 * A program with 1000 small `bytes` uploads (new each run): the server's store phase
 * (`store_ms` of the accepted resend, where the blobs are written to the memory cache) and the
 * call's end-to-end time, three runs.
 *
 *   deno run -A bench/probes/many_blobs.ts [gpu]
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { requestEvents, startReusedServer } from "./_probe.ts";

const logDir = await Deno.makeTempDir();
const server = await startReusedServer(1, { gpu: Deno.args.includes("gpu"), logDir });
const calls: { requestId: string; ms: number }[] = [];
try {
  await using client = new Client(server.url);
  for (let run = 0; run < 3; run++) {
    const program = new Program();
    const mod = program.upload({ kind: "module", source: "def f(*a):\n    return len(a)\n" });
    const args = Array.from(
      { length: 1000 },
      (_, i) =>
        program.upload({
          kind: "bytes",
          value: new TextEncoder().encode(`${run}:${i}:${Math.random()}`),
        }),
    );
    program.return_({
      key: "n",
      value: program.run({ fn: program.getFunction({ module: mod, name: "f" }), args }),
    });
    const start = performance.now();
    const result = await client.execute(program);
    if (result.get("n") !== 1000) throw new Error(JSON.stringify(result.error));
    calls.push({ requestId: result.requestId, ms: performance.now() - start });
  }
} finally {
  await server.stop();
}
const events = requestEvents(logDir);
for (const { requestId, ms } of calls) {
  const accepted = events.get(requestId)?.find((e) => e.event === "request_accepted");
  console.log(
    `1000 small blobs: store ${Number(accepted?.store_ms).toFixed(1)} ms, call ${ms.toFixed(0)} ms`,
  );
}
await Deno.remove(logDir, { recursive: true });
