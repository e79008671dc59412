/**
 * The types describing a valid program as `parseProgram` (in `program.ts`) reports it (spec
 * protocol §2.3–§2.7): its blobs and how they are used, its options, its instructions and its
 * tensor uploads.
 *
 * @module
 */

import type { DType } from "./dtypes.ts";

/**
 * How an upload uses a blob.
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { BlobUse } from "./program_types.ts";
 *
 * const text = '{"instructions":[{"op":"upload","kind":"bytes","blob":"' + "a".repeat(64) + '","id":"b"}]}';
 * const uses: Set<BlobUse> = parseProgram(text).blobs[0].uses;
 * if (!uses.has("bytes")) throw new Error();
 * ```
 */
export type BlobUse = "tensor" | "bytes" | "library" | "file";

/**
 * One distinct blob hash referenced by a program.
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { BlobReference } from "./program_types.ts";
 *
 * const hash = "a".repeat(64);
 * const program = parseProgram(
 *   `{"instructions":[{"op":"upload","kind":"tensor","blob":"${hash}","dtype":"int32","shape":[2],"id":"t"}]}`,
 * );
 * const blob: BlobReference = program.blobs[0];
 * if (blob.tensorByteLengths[0] !== 8) throw new Error();
 * ```
 */
export interface BlobReference {
  /** Lowercase hex SHA-256 of the blob bytes. */
  sha256: string;
  /** Every upload kind that uses this blob. */
  uses: Set<BlobUse>;
  /**
   * Expected byte length (`prod(shape) * itemsize`) of every tensor upload using this blob, in
   * program order (`Infinity` beyond 2^53-1).
   */
  tensorByteLengths: number[];
}

/**
 * Validated `options` of a program (raw values; the server clamps them).
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { ProgramOptions } from "./program_types.ts";
 *
 * const options: ProgramOptions = parseProgram(
 *   '{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}],"options":{"timeout_seconds":30}}',
 * ).options;
 * if (options.timeoutSeconds !== 30 || options.gpuCount !== undefined) throw new Error();
 * ```
 */
export interface ProgramOptions {
  /** `options.timeout_seconds`: finite, > 0. */
  timeoutSeconds?: number;
  /** `options.output_limit_bytes`: integer ≥ 0 (0 disables capture). */
  outputLimitBytes?: number;
  /** `options.gpu_count`: integer 1..8. */
  gpuCount?: number;
}

/**
 * One instruction as an error names it (`instruction_op`, `instruction_id`).
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { InstructionSummary } from "./program_types.ts";
 *
 * const instructions: InstructionSummary[] = parseProgram(
 *   '{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}]}',
 * ).instructions;
 * if (instructions[0].op !== "upload" || instructions[0].id !== "m") throw new Error();
 * ```
 */
export interface InstructionSummary {
  /** `upload`, `get_function`, `run` or `return`. */
  op: string;
  /** The handle id, `null` for a `return` (its key is not a handle). */
  id: string | null;
}

/**
 * What the server needs to know about a valid program.
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { ParsedProgram } from "./program_types.ts";
 *
 * const parsed: ParsedProgram = parseProgram('{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}]}');
 * if (parsed.instructionCount !== 1 || parsed.ops.upload !== 1) throw new Error();
 * ```
 */
export interface ParsedProgram {
  /** Number of instructions. */
  instructionCount: number;
  /**
   * Instruction count per op, for the ops the program uses, in first-appearance order (as
   * upstream's `request_accepted` event counts them).
   */
  ops: Record<string, number>;
  /** Upload count per kind the program uses (`module`, `tensor`, ...), first-appearance order. */
  uploads: Record<string, number>;
  /** Each instruction's `op` and `id` (`null` for returns), in program order. */
  instructions: InstructionSummary[];
  /** The validated options. */
  options: ProgramOptions;
  /** Referenced blobs, de-duplicated, in first-appearance order. */
  blobs: BlobReference[];
  /** Normalized file-upload paths, in program order. */
  filePaths: string[];
  /** Every tensor upload in program order: id, blob and expected byte length. */
  tensorUploads: TensorUpload[];
  /**
   * The first instruction takes the GPU lease (a module, tensor or library upload; spec protocol
   * §2.5), so a server may grant it together with the program.
   */
  leaseFirst: boolean;
}

/**
 * One tensor upload of a program.
 *
 * @example
 * ```ts
 * import { parseProgram } from "./program.ts";
 * import type { TensorUpload } from "./program_types.ts";
 *
 * const program = parseProgram(
 *   `{"instructions":[{"op":"upload","kind":"tensor","blob":"${"a".repeat(64)}","dtype":"int64","shape":[2,3],"id":"x"}]}`,
 * );
 * const [upload]: TensorUpload[] = program.tensorUploads;
 * if (upload.id !== "x" || upload.byteLength !== 48) throw new Error();
 * ```
 */
export interface TensorUpload {
  /** The upload's instruction id. */
  id: string;
  /** Its blob hash. */
  sha256: string;
  /** Its dtype. */
  dtype: DType;
  /** Its shape (dimensions beyond 2^53-1 are `bigint`). */
  shape: (number | bigint)[];
  /** `prod(shape) * itemsize` (`Infinity` beyond 2^53-1). */
  byteLength: number;
}
