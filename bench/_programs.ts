/** Programs and data shared by the server bench and the diagnostic probes. */
import { Program } from "../mod.ts";

/** `bytes` random bytes (filled 64 KiB at a time, the most `getRandomValues` takes). */
export function randomBytes(bytes: number): Uint8Array<ArrayBuffer> {
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 65536) {
    crypto.getRandomValues(data.subarray(i, Math.min(bytes, i + 65536)));
  }
  return data;
}

/** `n` random float32 values (finite). */
export function randomFloats(n: number): Float32Array {
  const out = new Float32Array(randomBytes(4 * n).buffer);
  for (let i = 0; i < n; i++) if (!Number.isFinite(out[i])) out[i] = 0;
  return out;
}

/** `c = a + b` over two float32 tensors uploaded by the program. */
export function addProgram(a: Float32Array, b: Float32Array): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def add(a, b):\n    return a + b\n" });
  const fn = program.getFunction({ module: mod, name: "add" });
  const args = [a, b].map((value) =>
    program.upload({ kind: "tensor", value, shape: [value.length] })
  );
  program.return_({ key: "c", value: program.run({ fn, args }) });
  return program;
}

/** A trivial request: `f(41)` returning 42 (the server bench's latency and throughput rows). */
export function trivialProgram(): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def f(x):\n    return x + 1\n" });
  const y = program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [41] });
  program.return_({ key: "y", value: y });
  return program;
}

/** A program taking `bytes` as a `bytes` upload and returning its length under `n`. */
export function lengthProgram(bytes: Uint8Array): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def size(b):\n    return len(b)\n" });
  const arg = program.upload({ kind: "bytes", value: bytes });
  const fn = program.getFunction({ module: mod, name: "size" });
  program.return_({ key: "n", value: program.run({ fn, args: [arg] }) });
  return program;
}

/** A program whose result is `mib` MiB of zero `bytes` (the Router bench's large answer). */
export function bytesResultProgram(mib: number): Program {
  const program = new Program();
  const mod = program.upload({
    kind: "module",
    source: `def make():\n    return bytes(${mib} * 1024 * 1024)\n`,
  });
  program.return_({
    key: "data",
    value: program.run({ fn: program.getFunction({ module: mod, name: "make" }), args: [] }),
  });
  return program;
}
