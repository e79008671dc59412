/** Programs and data shared by the server bench and the diagnostic probes. */
import { Program } from "../mod.ts";

/** `n` random float32 values (finite). */
export function randomFloats(n: number): Float32Array {
  const out = new Float32Array(n);
  const bytes = new Uint8Array(out.buffer);
  for (let i = 0; i < bytes.length; i += 65536) {
    crypto.getRandomValues(bytes.subarray(i, Math.min(bytes.length, i + 65536)));
  }
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
