/**
 * Loopback TCP throughput in Deno: 128 MiB per transfer over a bare socket, both ends in this
 * process (`loopback.py` is the same in Python).
 *
 *   deno run -A bench/probes/loopback.ts
 *
 * @module
 */
const N = 128 << 20;
const data = new Uint8Array(N);
for (let i = 0; i < N; i += 65536) crypto.getRandomValues(data.subarray(i, i + 65536));
const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
const port = (listener.addr as Deno.NetAddr).port;
const buf = new Uint8Array(N);
(async () => {
  const c = await listener.accept();
  for (let k = 0; k < 5; k++) {
    let got = 0;
    while (got < N) {
      const n = await c.read(buf.subarray(got));
      if (n === null) return;
      got += n;
    }
    await c.write(new Uint8Array([1]));
  }
})();
const s = await Deno.connect({ hostname: "127.0.0.1", port });
for (let k = 0; k < 5; k++) {
  const t0 = performance.now();
  let off = 0;
  while (off < N) off += await s.write(data.subarray(off));
  await s.read(new Uint8Array(1));
  const dt = performance.now() - t0;
  console.log(
    `deno loopback 128 MiB (same process): ${dt.toFixed(1)} ms (${(N / dt / 1e6).toFixed(2)} GB/s)`,
  );
}
s.close();
listener.close();
