/**
 * What a server keeps per request: two heap snapshots of a server process (through its
 * inspector, after a forced GC), before and after N more requests, and the object kinds that grew
 * most. `LARGE=1` sends programs with a new 2 MiB blob each (CACHE_MISS, then the resend) instead
 * of trivial ones; `N` sets the count (default 5000).
 *
 *   deno run -A bench/probes/heap_snapshot_diff.ts
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";

const INSPECT = "127.0.0.1:9333";
const server = await startReusedServer(4, {
  extra: ["--cache-capacity-bytes", String(64 << 20)],
  denoFlags: [`--inspect=${INSPECT}`],
});
const trivial = trivialProgram();

function largeProgram(): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def f(b):\n    return len(b)\n" });
  const value = new Uint8Array(2 << 20);
  crypto.getRandomValues(value.subarray(0, 65536));
  program.return_({
    key: "x",
    value: program.run({
      fn: program.getFunction({ module: mod, name: "f" }),
      args: [program.upload({ kind: "bytes", value })],
    }),
  });
  return program;
}

/** Object kinds in a heap snapshot: count and bytes. */
async function snapshot(): Promise<Map<string, [number, number]>> {
  const targets = await (await fetch(`http://${INSPECT}/json/list`)).json();
  const socket = new WebSocket(targets[0].webSocketDebuggerUrl);
  await new Promise((resolve) => socket.onopen = resolve);
  let chunks = "";
  const done = new Promise<void>((resolve) => {
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.method === "HeapProfiler.addHeapSnapshotChunk") chunks += message.params.chunk;
      if (message.id === 3) resolve();
    };
  });
  socket.send(JSON.stringify({ id: 1, method: "HeapProfiler.enable" }));
  socket.send(JSON.stringify({ id: 2, method: "HeapProfiler.collectGarbage" }));
  socket.send(JSON.stringify({ id: 3, method: "HeapProfiler.takeHeapSnapshot" }));
  await done;
  socket.close();
  const heap = JSON.parse(chunks);
  const fields: string[] = heap.snapshot.meta.node_fields;
  const types: string[] = heap.snapshot.meta.node_types[0];
  const [typeAt, nameAt, sizeAt] = ["type", "name", "self_size"].map((f) => fields.indexOf(f));
  const counts = new Map<string, [number, number]>();
  for (let i = 0; i < heap.nodes.length; i += fields.length) {
    const key = `${types[heap.nodes[i + typeAt]]}:${
      heap.strings[heap.nodes[i + nameAt]].slice(0, 60)
    }`;
    const entry = counts.get(key) ?? [0, 0];
    entry[0]++;
    entry[1] += heap.nodes[i + sizeAt];
    counts.set(key, entry);
  }
  return counts;
}

async function load(n: number) {
  const clients = Array.from({ length: 4 }, () => new Client(server.url));
  let sent = 0;
  const large = Deno.env.get("LARGE") !== undefined;
  await Promise.all(clients.map(async (c) => {
    while (sent < n) {
      sent++;
      await c.execute(large ? largeProgram() : trivial);
    }
  }));
  for (const c of clients) c.close();
}

await load(500);
const before = await snapshot();
await load(Number(Deno.env.get("N") ?? 5000));
const after = await snapshot();
const grown = [...after]
  .map(([key, [n, bytes]]) =>
    [key, n - (before.get(key)?.[0] ?? 0), bytes - (before.get(key)?.[1] ?? 0)] as const
  )
  .sort((a, b) => b[2] - a[2])
  .slice(0, 25);
console.log("    count      bytes  kind:name");
for (const [key, n, bytes] of grown) {
  console.log(`${String(n).padStart(9)} ${String(bytes).padStart(10)}  ${key}`);
}
await server.stop();
