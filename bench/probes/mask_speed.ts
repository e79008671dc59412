/**
 * What RFC 6455 client masking costs per MiB, 256 KiB payloads copied into a frame and masked:
 * a JavaScript loop over 32-bit words (the node's client before link/websocket_mask.ts), the
 * same loop unrolled 8 ×, and `maskInto` (WebAssembly SIMD over a 64 KiB scratch); the plain
 * copy for scale. Prints median, min and max of `--runs` runs (default 5) of 2000 payloads each.
 *
 *   deno run bench/probes/mask_speed.ts [--runs N]
 *
 * @module
 */
import { maskInto } from "../../link/websocket_mask.ts";
import { median } from "./_probe.ts";

const N = 256 * 1024;
const REPS = 2000;
const at = Deno.args.indexOf("--runs");
const runs = at >= 0 ? Number(Deno.args[at + 1]) : 5;
const payload = Uint8Array.from({ length: N }, (_, i) => i & 0xff);
const key = new Uint8Array([0x12, 0x34, 0x56, 0x78]);
const keyWord = new DataView(key.buffer).getUint32(0, true);
const frame = new Uint8Array(N + 8);
// A word view made per frame, as the client before link/websocket_mask.ts made it.
const wordsOf = () => new Uint32Array(frame.buffer, 8, N >>> 2);

const ways: [string, () => void][] = [
  ["copy only", () => frame.set(payload, 8)],
  ["copy + 32-bit word loop", () => {
    frame.set(payload, 8);
    const words = wordsOf();
    for (let i = 0; i < words.length; i++) words[i] ^= keyWord;
  }],
  ["copy + word loop unrolled 8 ×", () => {
    frame.set(payload, 8);
    const words = wordsOf();
    let i = 0;
    for (; i + 8 <= words.length; i += 8) {
      words[i] ^= keyWord;
      words[i + 1] ^= keyWord;
      words[i + 2] ^= keyWord;
      words[i + 3] ^= keyWord;
      words[i + 4] ^= keyWord;
      words[i + 5] ^= keyWord;
      words[i + 6] ^= keyWord;
      words[i + 7] ^= keyWord;
    }
    for (; i < words.length; i++) words[i] ^= keyWord;
  }],
  ["maskInto (WebAssembly SIMD)", () => maskInto(payload, key, frame.subarray(8))],
];

console.log("| way | ms/MiB median | min | max |\n|---|---|---|---|");
for (const [name, way] of ways) {
  for (let i = 0; i < 200; i++) way(); // warm-up: the JIT's optimised code
  const perMiB: number[] = [];
  for (let run = 0; run < runs; run++) {
    const start = performance.now();
    for (let i = 0; i < REPS; i++) way();
    perMiB.push((performance.now() - start) / (REPS * N / (1 << 20)));
  }
  const f = (v: number) => v.toFixed(3);
  console.log(
    `| ${name} | ${f(median(perMiB))} | ${f(Math.min(...perMiB))} | ${f(Math.max(...perMiB))} |`,
  );
}
