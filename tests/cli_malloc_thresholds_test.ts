import assert from "node:assert/strict";
import {
  MMAP_THRESHOLD_BYTES,
  pinMallocThresholds,
  TRIM_THRESHOLD_BYTES,
} from "../cli/malloc_thresholds.ts";
import { outputWithInput } from "./_child.ts";

/**
 * A child process allocates and frees eight node-link-sized buffers (256 KiB + 37) per cycle, as
 * a Router does with a large answer's messages, and prints the minor page faults of 32 cycles.
 */
async function faultsOfMessageChurn(args: string[], pin: boolean): Promise<number> {
  const module = new URL("../cli/malloc_thresholds.ts", import.meta.url).href;
  const script = `
    import { pinMallocThresholds } from ${JSON.stringify(module)};
    if (${pin}) { const outcome = pinMallocThresholds(); if (outcome !== "pinned") throw new Error(outcome); }
    const faults = () => {
      const stat = Deno.readTextFileSync("/proc/self/stat");
      return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[7]);
    };
    let before = 0;
    for (let cycle = 0; cycle < 40; cycle++) {
      if (cycle === 8) before = faults();
      const held = Array.from({ length: 8 }, () => new Uint8Array(256 * 1024 + 37).fill(1));
      for (const bytes of held) bytes.buffer.transfer(0);
    }
    console.log(faults() - before);
  `;
  const { code, stdout, stderr } = await outputWithInput(
    Deno.execPath(),
    ["run", "--no-config", ...args, "-"],
    script,
  );
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  return Number(new TextDecoder().decode(stdout).trim());
}

Deno.test("malloc thresholds: pinned, freed message buffers are reused instead of faulted in anew", async () => {
  const left = await faultsOfMessageChurn(["-A"], false);
  const pinned = await faultsOfMessageChurn(["-A"], true);
  // 32 cycles × 8 buffers × 65 pages: glibc's own thresholds fault nearly every page in again.
  assert.ok(left > 8000, `glibc's dynamic thresholds: ${left} faults`);
  assert.ok(pinned < 1000, `pinned: ${pinned} faults (left to glibc: ${left})`);
});

Deno.test("malloc thresholds: the operator's GLIBC_TUNABLES win, and no FFI permission changes nothing", async () => {
  assert.equal(
    pinMallocThresholds({ GLIBC_TUNABLES: "glibc.malloc.trim_threshold=1" }),
    "skipped: GLIBC_TUNABLES sets malloc tunables",
  );
  const module = new URL("../cli/malloc_thresholds.ts", import.meta.url).href;
  const { code, stdout } = await outputWithInput(
    Deno.execPath(),
    ["run", "--no-config", "--allow-read", "-"],
    `import { pinMallocThresholds } from ${
      JSON.stringify(module)
    }; console.log(pinMallocThresholds({}));`,
  );
  assert.equal(code, 0);
  assert.equal(new TextDecoder().decode(stdout).trim(), "skipped: no FFI permission");
  assert.equal(MMAP_THRESHOLD_BYTES * 2, TRIM_THRESHOLD_BYTES);
});
