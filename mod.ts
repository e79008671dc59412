/**
 * KCoral for Deno: run GPU benchmark programs on shared GPU servers.
 *
 * Build a {@linkcode Program} (uploads, `getFunction`, `run`, returns), send
 * it with a {@linkcode Client}, and read the {@linkcode ProgramResult}:
 * returned values, captured output and timings. The wire protocol is
 * byte-compatible with upstream KCoral, so this client works against
 * upstream servers and routers.
 *
 * @example
 * ```ts
 * import { Client, Program, Tensor } from "./mod.ts";
 *
 * const p = new Program();
 * const mod = p.upload({ kind: "module", source: "def add_one(x):\n    return x + 1\n" });
 * const fn = p.getFunction({ module: mod, name: "add_one" });
 * const x = p.upload({ kind: "tensor", value: new Float32Array([1, 2, 3, 4]), shape: [4] });
 * p.return_({ key: "y", value: p.run({ fn, args: [x] }) });
 *
 * const url = Deno.env.get("KCORAL_URL");
 * if (url) {
 *   await using client = new Client(url);
 *   const result = await client.execute(p, { timeoutSeconds: 30 });
 *   console.log(result.get<Tensor>("y").data); // Float32Array [2, 3, 4, 5]
 * }
 * ```
 *
 * @module
 */

export * from "./client/mod.ts";
export { JsonFloat } from "./protocol/json_float.ts";
export type { DType } from "./protocol/dtypes.ts";
export { parseProgram, ProgramError } from "./protocol/program.ts";
export type {
  BlobReference,
  BlobUse,
  InstructionSummary,
  ParsedProgram,
  ProgramOptions,
  TensorUpload,
} from "./protocol/program_types.ts";
export type {
  CommonResultFields,
  DecodedResult,
  ExecutionErrorInfo,
  ResultMeta,
} from "./protocol/result_fields.ts";
export type { DecodedValue } from "./protocol/values.ts";

export * from "./server/mod.ts";
export type * from "./options/spec.ts";
export type { OptionRule } from "./options/schema.ts";

// `deno run -A --unstable-no-legacy-abort jsr:@kcoral/cli …` runs the command line; importing
// stays side-effect free.
if (import.meta.main) {
  const { main } = await import("./cli.ts");
  Deno.exit(await main(Deno.args));
}
