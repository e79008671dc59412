/**
 * The KCoral TypeScript client: build a {@linkcode Program}, run it with a
 * {@linkcode Client}, read its {@linkcode ProgramResult}. Wire-compatible
 * with upstream KCoral servers and routers.
 *
 * @example
 * ```ts
 * import { Client, Program } from "./mod.ts";
 *
 * const program = new Program();
 * const module = program.upload({ kind: "module", source: "def scale(x, f):\n    return x * f\n" });
 * const scale = program.getFunction({ module, name: "scale" });
 * program.return_({ key: "output", value: program.run({ fn: scale, args: [3, 2] }) });
 *
 * const url = Deno.env.get("KCORAL_URL");
 * if (url) {
 *   await using client = new Client(url);
 *   console.log((await client.execute(program)).get("output")); // 6
 * }
 * ```
 *
 * @module
 */

export * from "./errors.ts";
export * from "./register.ts";
export { Tensor, type TensorData, type TensorLike } from "./tensor.ts";
export * from "./program_options.ts";
export * from "./program.ts";
export { ReturnedFile, ReturnedFolder } from "./artifacts.ts";
export { ProgramResult, type ResultValue } from "./result.ts";
export * from "./kept_return.ts";
export * from "./benchmark_result.ts";
export * from "./client.ts";
export * from "./evaluate.ts";
export * from "./verdict.ts";
export * from "./remote_function.ts";
export type { OutputChunk } from "../protocol/live_output.ts";
export type { GpuReading, GpuReceipt, GpuReceiptDevice } from "../protocol/gpu_receipt.ts";
