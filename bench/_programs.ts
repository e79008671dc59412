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
