/**
 * Receiving a 128 MiB request body through `Deno.serve` with a BYOB reader into one reused buffer
 * (nothing else: no scanning, no hashing), or with `request.bytes()` (`bytes`), the client a raw
 * socket in the same process; compare with `loopback.ts` (the same bytes over a bare socket).
 *
 *   deno run -A bench/probes/serve_body.ts [bytes]
 *
 * @module
 */
const N = 128 << 20;
const data = new Uint8Array(N);
for (let i = 0; i < N; i += 65536) crypto.getRandomValues(data.subarray(i, i + 65536));
let target = new ArrayBuffer(N); // BYOB reads hand back a new ArrayBuffer over it
let stats = { reads: 0, ms: 0 };
const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
  const t0 = performance.now();
  if (Deno.args.includes("bytes")) {
    const body = await req.bytes();
    stats = { reads: 1, ms: performance.now() - t0 };
    if (body.length !== N) throw new Error(`got ${body.length} bytes`);
    return new Response("ok");
  }
  let buffer = target;
  let offset = 0;
  let reads = 0;
  const r = req.body!.getReader({ mode: "byob" });
  for (;;) {
    if (offset >= N) break;
    const { value, done } = await r.read(
      new Uint8Array(buffer, offset, Math.min(N - offset, 8 << 20)),
    );
    if (done) break;
    buffer = value.buffer as ArrayBuffer;
    offset += value.length;
    reads++;
  }
  stats = { reads, ms: performance.now() - t0 };
  target = buffer;
  return new Response("ok");
});
const port = server.addr.port;
for (let k = 0; k < 4; k++) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const t0 = performance.now();
  await conn.write(
    new TextEncoder().encode(
      `POST / HTTP/1.1\r\nhost: x\r\ncontent-length: ${N}\r\nconnection: close\r\n\r\n`,
    ),
  );
  let off = 0;
  while (off < N) off += await conn.write(data.subarray(off));
  const buf = new Uint8Array(1024);
  await conn.read(buf);
  console.log(
    `total ${(performance.now() - t0).toFixed(1)} ms | server reads ${stats.reads} (${
      (N / stats.reads / 1024).toFixed(0)
    } KiB avg) in ${stats.ms.toFixed(1)} ms`,
  );
  conn.close();
}
await server.shutdown();
