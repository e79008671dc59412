/**
 * The server's cost of a kept return (docs/kept-returns.md): `keepReturns` copying a worker's
 * file of `--mib` MiB into the memory cache while hashing it, median/min/max over `--runs`,
 * beside its two floors measured in the same run: SHA-256 of the same bytes already in memory
 * (node:crypto, one core) and a plain copy of the file (`Deno.copyFile`).
 *
 * ```sh
 * deno run -A bench/kept_returns_bench.ts --mib 512 --runs 7
 * ```
 *
 * The worker's file is written in a temporary directory and the cache lives on `/dev/shm` when
 * there is one, as a server places them.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { BlobStore } from "../server/cache/cache_memory.ts";
import { keepReturns } from "../server/execute/kept_returns.ts";

const arg = (name: string, fallback: number) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Number(Deno.args[i + 1]) : fallback;
};
const mib = arg("--mib", 512);
const runs = arg("--runs", 7);
if (!(Number.isInteger(mib) && mib > 0 && Number.isInteger(runs) && runs > 0)) {
  console.error("usage: kept_returns_bench.ts [--mib N] [--runs N]");
  Deno.exit(2);
}

const work = await Deno.makeTempDir({ prefix: "kcoral-kept-bench-" });
const shm = await Deno.stat("/dev/shm").then((s) => s.isDirectory, () => false);
const cacheDir = shm
  ? await Deno.makeTempDir({ dir: "/dev/shm", prefix: "kcoral-kept-bench-" })
  : `${work}/cache`;
const bytes = new Uint8Array(mib << 20);
for (let i = 0; i < bytes.length; i += 4096) bytes[i] = i & 0xff;
const source = `${work}/kept-0`;
await Deno.writeFile(source, bytes);
const sha256 = createHash("sha256").update(bytes).digest("hex");

const samples: Record<string, number[]> = { keepReturns: [], "sha256 in memory": [], copyFile: [] };
try {
  for (let run = 0; run <= runs; run++) {
    const store = new BlobStore(`${cacheDir}/store-${run}`, 64 * (mib << 20));
    let t0 = performance.now();
    const placeholder = `kcoral-kept-${"0".repeat(32)}`;
    const [digest] = await keepReturns([{ path: source, size: bytes.length, placeholder }], {
      store,
      maxBytes: bytes.length,
    });
    const keep = performance.now() - t0;
    if (digest !== sha256) throw new Error(`keepReturns cached ${digest}, not ${sha256}`);
    store.close();
    t0 = performance.now();
    createHash("sha256").update(bytes).digest("hex");
    const hash = performance.now() - t0;
    t0 = performance.now();
    await Deno.copyFile(source, `${cacheDir}/copy`);
    const copy = performance.now() - t0;
    await Deno.remove(`${cacheDir}/copy`);
    if (run === 0) continue; // untimed: the page cache and the thread pool warm up
    samples.keepReturns.push(keep);
    samples["sha256 in memory"].push(hash);
    samples.copyFile.push(copy);
  }
} finally {
  await Deno.remove(work, { recursive: true });
  await Deno.remove(cacheDir, { recursive: true }).catch(() => {});
}

const stats = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
};
const keepMedian = stats(samples.keepReturns).median;
console.log(
  `kept_returns_bench: ${mib} MiB, ${runs} runs (after one untimed), cache on ${
    shm ? "/dev/shm" : "the temp dir"
  }, ${new Date().toISOString().slice(0, 10)}`,
);
console.log("| what (ms) | median | min | max | MiB/s (median) | keepReturns / this |");
console.log("|---|---|---|---|---|---|");
for (const [name, xs] of Object.entries(samples)) {
  const { median, min, max } = stats(xs);
  console.log(
    `| ${name} | ${median.toFixed(1)} | ${min.toFixed(1)} | ${max.toFixed(1)} | ${
      (mib / (median / 1000)).toFixed(0)
    } | ${(keepMedian / median).toFixed(2)} |`,
  );
}
