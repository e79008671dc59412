/**
 * Writing a new 64 MiB file in /dev/shm through one handle, or split over 2 or 4 handles writing
 * their ranges at once (the kernel serializes writes to one file, so splitting does not help).
 *
 *   deno run -A bench/probes/file_write_split.ts
 *
 * @module
 */
import { randomBytes } from "../_programs.ts";

const N = 64 << 20;
const data = randomBytes(N);
async function one(path: string) {
  const f = await Deno.open(path, { write: true, createNew: true, mode: 0o644 });
  let r = data;
  while (r.length) r = r.subarray(await f.write(r));
  f.close();
}
async function split(path: string, k: number) {
  const f = await Deno.open(path, { write: true, createNew: true, mode: 0o644 });
  await f.truncate(N);
  const step = Math.ceil(N / k / 4096) * 4096;
  await Promise.all(Array.from({ length: k }, async (_, i) => {
    const g = await Deno.open(path, { write: true });
    await g.seek(i * step, Deno.SeekMode.Start);
    let r = data.subarray(i * step, Math.min(N, (i + 1) * step));
    while (r.length) r = r.subarray(await g.write(r));
    g.close();
  }));
  f.close();
}
for (
  const [name, fn] of [["one", (p: string) => one(p)], ["split2", (p: string) => split(p, 2)], [
    "split4",
    (p: string) => split(p, 4),
  ]] as const
) {
  const xs = [];
  for (let k = 0; k < 6; k++) {
    const p = `/dev/shm/pw-${k}`;
    try {
      Deno.removeSync(p);
    } catch { /**/ }
    const t = performance.now();
    await fn(p);
    xs.push(performance.now() - t);
    Deno.removeSync(p);
  }
  xs.sort((a, b) => a - b);
  console.log(name, xs.map((x) => x.toFixed(1)).join(" "));
}
