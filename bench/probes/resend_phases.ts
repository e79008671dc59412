/**
 * The cache-miss resend of a 64 MiB `c = a + b` (two new 64 MiB inputs): miss and hit times,
 * the resend cost per MiB, and the server's receive/parse/store split of each upload.
 *
 *   deno run -A bench/probes/resend_phases.ts [gpu]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { addProgram, requestEvents, startServerProcess } from "./_probe.ts";

const logDir = await Deno.makeTempDir();
const server = await startServerProcess([
  "--log-dir",
  logDir,
  "--max-requests-per-worker",
  "0",
  "--disk-cache-dir",
  "",
  "--workers-per-gpu",
  "2",
], { gpu: Deno.args.includes("gpu") });
{
  await using client = new Client(server.url);
  for (let k = 0; k < 4; k++) {
    const program = addProgram();
    let start = performance.now();
    await client.execute(program);
    const miss = performance.now() - start;
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
for (const events of requestEvents(logDir).values()) {
  const accepted = events.find((e) => e.event === "request_accepted");
  if (accepted && Number(accepted.receive_ms) > 5) {
    const ms = (key: string) => Number(accepted[key]).toFixed(1);
    console.log(`recv ${ms("receive_ms")} parse ${ms("parse_ms")} store ${ms("store_ms")}`);
  }
}
