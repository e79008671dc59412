/**
 * Uploads that declare a large body and never send it: the server's resident memory and its
 * `/health` latency while `count` connections (default 300) each hold a `POST /execute` head with
 * `Content-Length: 256 MiB` and no body, then after they hang up. Before commit 11289dd every
 * such upload got a Content-Length-sized buffer at once; at most four do now (docs/architecture.md
 * §2.2.3). Here (2 cores, simulated GPUs, 300 uploads), the code before it against main: RSS while
 * held 782 → 142 MiB, `/health` max 653 → 0.7 ms (the H200 VM showed 1.3 GB and ~2 s before).
 *
 *   deno run -A bench/probes/declared_uploads.ts [count]
 *
 * @module
 */
import { startReusedServer } from "./_probe.ts";
import { summarize } from "../_stats.ts";

const count = Number(Deno.args.find((arg) => /^\d+$/.test(arg)) ?? 300);
const server = await startReusedServer(1);
const port = Number(new URL(server.url).port);

function rssMiB(): number {
  const status = Deno.readTextFileSync(`/proc/${server.child.pid}/status`);
  const kib = Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN);
  return kib / 1024;
}

async function healthMs(samples = 10): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < samples; i++) {
    const start = performance.now();
    const response = await fetch(`${server.url}/health`);
    await response.body?.cancel();
    out.push(performance.now() - start);
  }
  return out;
}

const head = new TextEncoder().encode(
  "POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
    "Content-Type: multipart/form-data; boundary=declared\r\n" +
    `Content-Length: ${256 << 20}\r\n\r\n`,
);
const rows: [string, number, string][] = [];
const conns: Deno.TcpConn[] = [];
try {
  await healthMs(3); // warm
  rows.push(["RSS, idle", rssMiB(), "MiB"]);
  const idle = summarize(await healthMs());
  for (let i = 0; i < count; i++) {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    await conn.write(head);
    conns.push(conn);
  }
  await new Promise((resolve) => setTimeout(resolve, 1000));
  rows.push([`RSS, ${count} declared-only uploads held`, rssMiB(), "MiB"]);
  const held = summarize(await healthMs());
  for (const conn of conns.splice(0)) conn.close();
  await new Promise((resolve) => setTimeout(resolve, 1000));
  rows.push(["RSS, after they hung up", rssMiB(), "MiB"]);
  const after = summarize(await healthMs());
  rows.push(["/health median, idle", idle.median, "ms"]);
  rows.push([
    `/health median, ${count} uploads held (max ${held.max.toFixed(1)})`,
    held.median,
    "ms",
  ]);
  rows.push(["/health median, after", after.median, "ms"]);
} finally {
  for (const conn of conns) conn.close();
  await server.stop();
}
console.log("| measure | value | unit |\n|---|---|---|");
for (const [name, value, unit] of rows) console.log(`| ${name} | ${value.toFixed(1)} | ${unit} |`);
