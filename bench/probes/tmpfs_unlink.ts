/**
 * How long unlinking a file on a RAM-backed filesystem holds the calling thread: the unlink frees
 * the file's pages inside the call (docs/decisions/large-file-unlink.md, "A large file's unlink leaves the event
 * loop"). For each size, `--rounds` files are written to a directory under `--dir` (default
 * `/dev/shm`) and unlinked with `Deno.removeSync`; a table of median, min and max ms.
 *
 *   deno run -A bench/probes/tmpfs_unlink.ts [--dir /dev/shm] [--rounds 5]
 *
 * @module
 */
import { median, numberArg } from "./_probe.ts";

const dirIndex = Deno.args.indexOf("--dir");
const base = dirIndex >= 0 ? Deno.args[dirIndex + 1] : "/dev/shm";
const rounds = numberArg("--rounds", 5);
const dir = Deno.makeTempDirSync({ dir: base, prefix: "kcoral-unlink-" });
try {
  console.log(`| file | median ms | min ms | max ms |  (${base}, ${rounds} each)`);
  console.log("|---|---|---|---|");
  for (const mib of [1, 16, 64, 256]) {
    const data = new Uint8Array(mib << 20).fill(1);
    const times: number[] = [];
    for (let i = 0; i < rounds; i++) {
      Deno.writeFileSync(`${dir}/file`, data);
      const start = performance.now();
      Deno.removeSync(`${dir}/file`);
      times.push(performance.now() - start);
    }
    const [min, max] = [Math.min(...times), Math.max(...times)];
    console.log(
      `| ${mib} MiB | ${median(times).toFixed(2)} | ${min.toFixed(2)} | ${max.toFixed(2)} |`,
    );
  }
} finally {
  Deno.removeSync(dir, { recursive: true });
}
