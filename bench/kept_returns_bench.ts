/**
 * The server's cost of a kept return (docs/kept-returns.md): `keepReturns` copying a worker's
 * file of `--mib` MiB into the memory cache while hashing it (on one of its hashing threads),
 * median/min/max over `--runs`, beside its two floors measured in the same run: SHA-256 of the same bytes already in memory
 * (node:crypto, one core) and a plain copy of the file (`Deno.copyFile`). A second row keeps the
 * same bytes as `--values` values (an eval bundle's segments), several at once on the hashing
 * threads (`--threads`, default as a server: the cores less one, at most 8).
 *
 * ```sh
 * deno run -A bench/kept_returns_bench.ts --mib 512 --runs 7 [--values 8] [--threads N]
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
import { HashThreads } from "../protocol/hash_threads.ts";

const arg = (name: string, fallback: number) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Number(Deno.args[i + 1]) : fallback;
};
const mib = arg("--mib", 512);
const runs = arg("--runs", 7);
const valueCount = arg("--values", 8);
const threads = arg(
  "--threads",
  Math.max(1, Math.min(8, (navigator.hardwareConcurrency ?? 2) - 1)),
);
if (
  ![mib, runs, valueCount, threads].every((n) => Number.isInteger(n) && n > 0) || valueCount > mib
) {
  console.error(
    "usage: kept_returns_bench.ts [--mib N] [--runs N] [--values N <= mib] [--threads N]",
  );
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
// The same bytes as several values, cut as an eval bundle's segments are (about equal shares).
const share = Math.ceil(bytes.length / valueCount);
const values = await Promise.all(
  Array.from({ length: valueCount }, async (_, k) => {
    const piece = bytes.subarray(k * share, Math.min(bytes.length, (k + 1) * share));
    const path = `${work}/kept-part-${k}`;
    await Deno.writeFile(path, piece);
    const placeholder = `kcoral-kept-${String(k).padStart(32, "0")}`;
    return { path, size: piece.length, placeholder };
  }),
);
const hashes = new HashThreads(threads);
hashes.warm();
const split = `keepReturns, ${valueCount} values, ${threads} hashing threads`;

const samples: Record<string, number[]> = {
  keepReturns: [],
  [split]: [],
  "sha256 in memory": [],
  copyFile: [],
};
try {
  for (let run = 0; run <= runs; run++) {
    const splitStore = new BlobStore(`${cacheDir}/split-${run}`, 64 * (mib << 20));
    const s0 = performance.now();
    await keepReturns(values, { store: splitStore, maxBytes: bytes.length, hashes });
    const splitMs = performance.now() - s0;
    splitStore.close();
    if (run > 0) samples[split].push(splitMs);
    const store = new BlobStore(`${cacheDir}/store-${run}`, 64 * (mib << 20));
    let t0 = performance.now();
    const placeholder = `kcoral-kept-${"0".repeat(32)}`;
    const [digest] = await keepReturns([{ path: source, size: bytes.length, placeholder }], {
      store,
      maxBytes: bytes.length,
      hashes,
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
  hashes.close();
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
