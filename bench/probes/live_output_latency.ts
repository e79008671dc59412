/**
 * Live output's latency (docs/live-output.md): from a `print` on the worker to its chunk at the
 * client. The program prints its wall clock (`time.time_ns()`) 40 times, 137 ms apart (so the
 * prints fall anywhere in the server's 50 ms reading period); the client takes each chunk's
 * arrival on the same clock. One server process (simulated GPU 0), `--sandbox none`; `router` sends
 * the requests through a Router and a node instead (both processes of this tree).
 *
 *   deno run -A bench/probes/live_output_latency.ts [router]
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { startServerProcess } from "./_probe.ts";
import { startNode, startRouter, waitForCapacity } from "../../tests/_router.ts";

const SOURCE = [
  "import time",
  "def f(n, pause):",
  "    for _ in range(n):",
  "        print(time.time_ns(), flush=True)",
  "        time.sleep(pause)",
  "    return n",
  "",
].join("\n");

function program(n: number, pause: number): Program {
  const p = new Program();
  const module = p.upload({ kind: "module", source: SOURCE });
  const fn = p.getFunction({ module, name: "f" });
  p.return_({ key: "n", value: p.run({ fn, args: [n, pause] }) });
  return p;
}

const routed = Deno.args.includes("router");
let url: string;
let stop: () => Promise<unknown>;
if (routed) {
  const router = await startRouter();
  const node = await startNode(router.url, "live-latency");
  await waitForCapacity(router.url, 1);
  url = router.url;
  stop = async () => {
    await node.stop();
    await router.stop();
  };
} else {
  const server = await startServerProcess([]);
  url = server.url;
  stop = () => server.stop();
}
try {
  await using client = new Client(url);
  await client.execute(program(2, 0.01), { onOutput: () => {} }); // warm-up
  const ms: number[] = [];
  let pending = "";
  await client.execute(program(40, 0.137), {
    timeoutSeconds: 60,
    onOutput: (chunk) => {
      const now = performance.timeOrigin + performance.now();
      pending += chunk.data;
      const lines = pending.split("\n");
      pending = lines.pop()!;
      for (const line of lines) ms.push(now - Number(line) / 1e6);
    },
  });
  ms.sort((a, b) => a - b);
  console.log(
    `live output${routed ? " through a Router" : ""}: print -> chunk over ${ms.length} prints: ` +
      `median ${ms[ms.length >> 1].toFixed(1)} ms, min ${ms[0].toFixed(1)} ms, max ${
        ms[ms.length - 1].toFixed(1)
      } ms`,
  );
} finally {
  await stop();
}
