/**
 * What a node-link message costs in a round trip: our WebSocket client (http/websocket_client.ts)
 * against a `Deno.upgradeWebSocket` server in one process, a trivial exchange as three messages
 * each way (head, a small data frame, end: the link before whole frames) and as one each way (a
 * whole frame). Prints median, min and max µs per round trip over `--runs` runs (default 4) of
 * 3000 round trips, the two ways alternating.
 *
 *   deno run -A bench/probes/link_messages.ts [--runs N]
 *
 * @module
 */
import { WebSocketClient } from "../../http/websocket_client.ts";
import { median } from "./_probe.ts";

const at = Deno.args.indexOf("--runs");
const runs = at >= 0 ? Number(Deno.args[at + 1]) : 4;
const head = JSON.stringify({
  t: "response_head",
  status: 200,
  headers: [["content-length", "300"]],
});

const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
  const { socket, response } = Deno.upgradeWebSocket(request);
  socket.binaryType = "arraybuffer";
  let parts = 0;
  socket.onmessage = (event) => {
    const three = typeof event.data === "string" ? event.data.startsWith("3") : true;
    if (!three) return socket.send(new Uint8Array(360)); // one whole answer
    if (++parts < 3) return;
    parts = 0;
    socket.send(head);
    socket.send(new Uint8Array(300));
    socket.send('{"t":"end"}');
  };
  return response;
});
const client = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
await new Promise<void>((resolve) => (client.onopen = () => resolve()));
let waiting = 0;
let done: () => void = () => {};
client.onmessage = () => void (--waiting === 0 && done());

function roundTrip(messages: 1 | 3): Promise<void> {
  const answered = new Promise<void>((resolve) => (done = resolve));
  waiting = messages;
  if (messages === 3) {
    client.send('3{"t":"request_head","headers":[]}');
    client.send(new Uint8Array(500));
    client.send('3{"t":"end"}');
  } else client.send("1" + "x".repeat(560));
  return answered;
}

const perTrip: Record<string, number[]> = { 3: [], 1: [] };
for (let run = 0; run <= runs; run++) {
  for (const messages of [3, 1] as const) {
    const start = performance.now();
    for (let i = 0; i < 3000; i++) await roundTrip(messages);
    if (run > 0) perTrip[messages].push((performance.now() - start) / 3000 * 1000); // run 0 warms
  }
}
console.log("| messages each way | µs per round trip, median | min | max |\n|---|---|---|---|");
for (const messages of [3, 1]) {
  const v = perTrip[messages];
  const f = (x: number) => x.toFixed(1);
  console.log(`| ${messages} | ${f(median(v))} | ${f(Math.min(...v))} | ${f(Math.max(...v))} |`);
}
client.close();
await server.shutdown();
