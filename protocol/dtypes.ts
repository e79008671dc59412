/**
 * The 12 tensor dtypes of the wire protocol (spec protocol §2.7).
 *
 * @module
 */

/**
 * A tensor element type: torch dtype names without `torch.`, little-endian on the wire.
 *
 * @example
 * ```ts
 * import type { DType } from "../mod.ts";
 *
 * const dtype: DType = "bfloat16";
 * ```
 */
export type DType =
  | "bool"
  | "uint8"
  | "int8"
  | "int16"
  | "int32"
  | "int64"
  | "float16"
  | "float32"
  | "float64"
  | "bfloat16"
  | "float8_e4m3fn"
  | "float8_e5m2";

/**
 * Bytes per element of every {@linkcode DType}.
 */
export const DTYPE_ITEM_SIZES: Readonly<Record<DType, number>> = Object.freeze({
  bool: 1,
  uint8: 1,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  float16: 2,
  float32: 4,
  float64: 8,
  bfloat16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
});

/** Whether `x` names one of the 12 wire dtypes (exact, case-sensitive). */
export function isDType(x: unknown): x is DType {
  return typeof x === "string" && Object.hasOwn(DTYPE_ITEM_SIZES, x);
}

/**
 * Expected byte length of a tensor: `prod(shape) * itemsize`, computed exactly. Lengths above
 * 2^53-1 are returned as `Infinity` (no real body can have them).
 */
export function tensorByteLength(dtype: DType, shape: readonly (number | bigint)[]): number {
  let total = BigInt(DTYPE_ITEM_SIZES[dtype]);
  for (const dimension of shape) total *= BigInt(dimension);
  return total <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(total) : Infinity;
}
