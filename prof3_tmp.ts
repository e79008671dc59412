import { Client, Program } from "./mod.ts";
import { startServer } from "./tests/_server.ts";
const server = await startServer({ device: "gpu", simulateGpus: true, gpus: [0], workersPerGpu: 1, maxRequestsPerWorker: 0, diskCacheDir: null });
const n = 16 * 1024 * 1024;
function rnd() { const a = new Float32Array(n); const b = new Uint8Array(a.buffer); for (let i = 0; i < b.length; i += 65536) crypto.getRandomValues(b.subarray(i, i + 65536)); for (let i=0;i<n;i++) if(!Number.isFinite(a[i])) a[i]=0; return a; }
const client = new Client(server.url);
const origFetch = globalThis.fetch;
globalThis.fetch = async (...args: Parameters<typeof fetch>) => { const t = performance.now(); const r = await origFetch(...args); console.log("   fetch headers after", (performance.now()-t).toFixed(0), "ms"); return r; };
for (let round = 0; round < 3; round++) {
  const p = new Program();
  const m = p.upload({ kind: "module", source: "def add(a, b):\n    return a + b\n" });
  const f = p.getFunction({ module: m, name: "add" });
  const a = p.upload({ kind: "tensor", value: rnd(), shape: [n] });
  const b = p.upload({ kind: "tensor", value: rnd(), shape: [n] });
  p.return_({ key: "c", value: p.run({ fn: f, args: [a, b] }) });
  const start = server.events.length;
  let t = performance.now();
  const r = await client.execute(p);
  console.log("execute(miss)", (performance.now() - t).toFixed(0), "elapsed", r.elapsedMs.toFixed(0));
  for (const e of server.events.slice(start)) console.log("  ", e.timestamp.slice(17), e.event, e.finish_reason ?? "");
  t = performance.now();
  const r2 = await client.execute(p);
  console.log("execute(hit)", (performance.now() - t).toFixed(0), "elapsed", r2.elapsedMs.toFixed(0), "held", r2.leaseHeldMs.toFixed(0));
}
client.close();
await server.stop();
