/**
 * A value a program returned that the server kept in its blob cache instead of sending
 * (`ExecuteOptions.keepReturns`, protocol/kept_returns.ts): its digest, size and, for a
 * tensor, dtype and shape, but no bytes. A later program uploads it by reference
 * (`program.upload({ kind: "bytes", value: kept })`) and sends nothing; a server that has
 * dropped it since answers that program with a {@linkcode ProtocolError} naming the blob.
 *
 * @module
 */

import type { KeptNode } from "../protocol/kept_returns.ts";
import type { DType } from "../protocol/dtypes.ts";

/**
 * A returned value kept by the server: what a later program needs to name it.
 *
 * @example
 * ```ts
 * import { KeptReturn, Program } from "./mod.ts";
 *
 * const kept = new KeptReturn({ kind: "bytes", sha256: "ab".repeat(32), size: 1 << 30 });
 * const program = new Program();
 * program.upload({ kind: "bytes", value: kept });
 * if (program.instructions[0].blob !== kept.sha256 || program.blobs.size !== 0) throw new Error();
 * ```
 */
export class KeptReturn {
  /** `bytes`, or a tensor with {@linkcode dtype} and {@linkcode shape}. */
  readonly kind: "bytes" | "tensor";
  /** The SHA-256 the server holds it under (lowercase hex). */
  readonly sha256: string;
  /** Its size in bytes. */
  readonly size: number;
  /** A tensor's dtype (`null` for bytes). */
  readonly dtype: DType | null;
  /** A tensor's shape (`null` for bytes). */
  readonly shape: readonly number[] | null;

  /** Wraps a decoded `kept` node. */
  constructor(node: KeptNode) {
    this.kind = node.kind;
    this.sha256 = node.sha256;
    this.size = node.size;
    this.dtype = (node.dtype as DType | undefined) ?? null;
    this.shape = node.shape ? Object.freeze([...node.shape]) : null;
  }
}
