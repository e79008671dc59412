/**
 * Issue 44's hostile-client figures on a CPU `kcoral server` process (one worker): `--heads`
 * connections that send half a request head and `--bodies` that send a head and then one byte
 * of body now and then, all at once; meanwhile `/health` is asked every 20 ms on its own
 * connection each time, and one normal program runs. Prints `/health`'s latencies (p50, p99,
 * max), whether the program completed, and when the stalled connections were closed by the
 * server, against the timeouts. Needs a descriptor limit above heads + bodies for both
 * processes (`ulimit -n`).
 *
 *   deno run -A bench/hostile_clients_bench.ts [--heads 3000] [--bodies 500] \
 *     [--header-timeout 10] [--body-timeout 10]
 *
 * @module
 */
import { callProgram, multipartBody } from "../tests/_server.ts";
import { summarize } from "./_stats.ts";

const _encoder = new TextEncoder();

function _arg(name: string, fallback: number): number {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Number(Deno.args[i + 1]) : fallback;
}

const heads = _arg("--heads", 3000);
const bodies = _arg("--bodies", 500);
const headerTimeout = _arg("--header-timeout", 10);
const bodyTimeout = _arg("--body-timeout", 10);

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
const port = (listener.addr as Deno.NetAddr).port;
listener.close();
const server = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    new URL("../cli.ts", import.meta.url).pathname,
    "server",
    "--device",
    "cpu",
    "--num-workers",
    "1",
    "--sandbox",
    "none",
    "--port",
    String(port),
    "--log-dir",
    "",
    "--no-log-console",
    "--disk-cache-dir",
    "",
    "--header-timeout-seconds",
    String(headerTimeout),
    "--body-timeout-seconds",
    String(bodyTimeout),
    "--max-connections",
    String(heads + bodies + 100),
  ],
  stdin: "null",
  stdout: "null",
  stderr: "piped",
}).spawn();
const reader = server.stderr.pipeThrough(new TextDecoderStream()).getReader();
for (let seen = ""; !seen.includes("Application startup complete.");) {
  const { value, done } = await reader.read();
  if (done) throw new Error(`server exited:\n${seen}`);
  seen += value;
}
(async () => {
  while (!(await reader.read()).done) { /* drain */ }
})().catch(() => {});

const connect = () => Deno.connect({ hostname: "127.0.0.1", port });
const start = performance.now();
const startWall = Date.now();
/** Seconds from the start until each stalled connection was closed by the server. */
const closedAfter: { kind: string; s: number }[] = [];
function watchClose(conn: Deno.Conn, kind: string): void {
  (async () => {
    const buffer = new Uint8Array(4096);
    try {
      while (await conn.read(buffer) !== null) { /* the 408 */ }
    } catch { /* reset */ }
    closedAfter.push({ kind, s: (performance.now() - start) / 1000 });
    conn.close();
  })();
}

// /health is asked from a worker thread of its own, so that this thread's work (thousands of
// connections opened and watched) does not count as the server's latency.
const probeSource = `
  let probing = true;
  const ms = [];
  self.onmessage = () => { probing = false; };
  (async () => {
    while (probing) {
      const t = performance.now();
      const response = await fetch("http://127.0.0.1:${port}/health", { headers: { connection: "close" } });
      await response.body?.cancel();
      if (response.status === 200) ms.push([Date.now(), performance.now() - t]);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    self.postMessage(ms);
  })();
`;
const prober = new Worker(
  URL.createObjectURL(new Blob([probeSource], { type: "application/javascript" })),
  { type: "module" },
);
const probes = new Promise<[number, number][]>((resolve) =>
  prober.onmessage = (e) => resolve(e.data)
);

const stalledBodies: Deno.Conn[] = [];
for (let i = 0; i < heads; i++) {
  const conn = await connect();
  await conn.write(_encoder.encode("POST /execute HTTP/1.1\r\nhost: x\r\ncontent-le"));
  watchClose(conn, "head");
}
for (let i = 0; i < bodies; i++) {
  const conn = await connect();
  await conn.write(_encoder.encode(
    "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
      "content-length: 100000\r\n\r\n--b\r\n",
  ));
  stalledBodies.push(conn);
  watchClose(conn, "body");
}
const opened = (performance.now() - start) / 1000;
const { body, contentType } = multipartBody([{
  name: "program",
  contentType: "application/json",
  body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
}]);
const program = await fetch(`http://127.0.0.1:${port}/execute`, {
  method: "POST",
  headers: { "content-type": contentType },
  body: body as Uint8Array<ArrayBuffer>,
});
const programOk = program.status === 200 && (await program.json()).status === "COMPLETED";
while (closedAfter.length < heads + bodies) {
  await new Promise((resolve) => setTimeout(resolve, 100));
  if ((performance.now() - start) / 1000 > opened + 3 * Math.max(headerTimeout, bodyTimeout)) break;
}
prober.postMessage("stop");
const probed = await probes;
const healthMs = probed.map(([, ms]) => ms);
prober.terminate();
server.kill("SIGTERM");
await server.status;

const sorted = [...healthMs].sort((a, b) => a - b);
const p = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
const { median, max } = summarize(healthMs);
const closed = (kind: string) => closedAfter.filter((c) => c.kind === kind).map((c) => c.s);
console.log(`| what | value |\n|---|---|`);
console.log(
  `| half-sent heads / trickled bodies | ${heads} / ${bodies} (opened in ${opened.toFixed(1)} s) |`,
);
console.log(`| /health answers while they stalled | ${healthMs.length} |`);
console.log(
  `| /health ms: p50 / p99 / max | ${median.toFixed(2)} / ${p(0.99).toFixed(2)} / ${
    max.toFixed(2)
  } |`,
);
console.log(`| normal program completed | ${programOk} |`);
const firstClose = Math.min(...closedAfter.map((c) => c.s));
const lastClose = Math.max(...closedAfter.map((c) => c.s));
for (
  const [phase, from, to] of [
    ["opening them", 0, opened],
    ["all of them stalled", opened, firstClose],
    ["the server cutting them", firstClose, lastClose],
    ["after", lastClose, Infinity],
  ] as const
) {
  const ms = probed.filter(([at]) =>
    (at - startWall) / 1000 >= from && (at - startWall) / 1000 < to
  )
    .map(([, ms]) => ms).sort((a, b) => a - b);
  if (ms.length === 0) continue;
  const q = (x: number) => ms[Math.min(ms.length - 1, Math.floor(x * ms.length))];
  console.log(
    `| /health ms while ${phase} (${ms.length}): p50 / p99 / max | ` +
      `${q(0.5).toFixed(2)} / ${q(0.99).toFixed(2)} / ${ms.at(-1)!.toFixed(2)} |`,
  );
}
for (const [kind, timeout] of [["head", headerTimeout], ["body", bodyTimeout]] as const) {
  const s = closed(kind);
  const latest = s.length ? Math.max(...s) : NaN;
  console.log(
    `| ${kind}s closed by the server | ${s.length} of ${kind === "head" ? heads : bodies}, ` +
      `the last ${latest.toFixed(1)} s after the start (timeout ${timeout} s, all opened by ` +
      `${opened.toFixed(1)} s) |`,
  );
}
