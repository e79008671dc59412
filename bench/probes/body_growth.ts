/**
 * What receiving a body of unknown length costs in memory handling alone: 64 MiB arriving in
 * 256 KiB pieces written into a buffer that doubles and copies (the client's chunked reader
 * before `growBodyBuffer`), into `growBodyBuffer`'s in-place growth, the same followed by
 * `transferToFixedLength` (which copies), and into a buffer presized to the length (a
 * Content-Length body). Each run makes fresh buffers, so page faults count, as they do for an
 * answer. Prints median, min and max of `--runs` runs (default 5), ms per body.
 *
 *   deno run bench/probes/body_growth.ts [--runs N]
 *
 * @module
 */
import { growBodyBuffer } from "../../client/transport/http1_reader.ts";
import { median } from "./_probe.ts";

const TOTAL = 64 << 20;
const PIECE = 256 * 1024;
const at = Deno.args.indexOf("--runs");
const runs = at >= 0 ? Number(Deno.args[at + 1]) : 5;
const piece = new Uint8Array(PIECE).fill(3);

function doubling(): Uint8Array {
  let buffer = new Uint8Array(64 * 1024);
  for (let length = 0; length < TOTAL; length += PIECE) {
    if (length + PIECE > buffer.length) {
      const grown = new Uint8Array(Math.max(buffer.length * 2, length + PIECE));
      grown.set(buffer.subarray(0, length));
      buffer = grown;
    }
    buffer.set(piece, length);
  }
  return buffer.subarray(0, TOTAL);
}

function inPlace(): Uint8Array {
  let buffer: Uint8Array = new Uint8Array(64 * 1024);
  for (let length = 0; length < TOTAL; length += PIECE) {
    if (length + PIECE > buffer.length) buffer = growBodyBuffer(buffer, length, length + PIECE);
    buffer.set(piece, length);
  }
  return buffer.subarray(0, TOTAL);
}

function presized(): Uint8Array {
  const buffer = new Uint8Array(TOTAL);
  for (let length = 0; length < TOTAL; length += PIECE) buffer.set(piece, length);
  return buffer;
}

const ways: [string, () => unknown][] = [
  ["doubling, copying", doubling],
  ["in place (growBodyBuffer)", inPlace],
  ["in place, then transferToFixedLength", () => {
    const body = inPlace();
    return (body.buffer as ArrayBuffer).transferToFixedLength(body.length);
  }],
  ["presized (Content-Length)", presized],
];

console.log("| way | ms median | min | max |\n|---|---|---|---|");
for (const [name, way] of ways) {
  way();
  const times: number[] = [];
  for (let run = 0; run < runs; run++) {
    const start = performance.now();
    way();
    times.push(performance.now() - start);
  }
  const f = (v: number) => v.toFixed(1);
  console.log(
    `| ${name} | ${f(median(times))} | ${f(Math.min(...times))} | ${f(Math.max(...times))} |`,
  );
}
