/**
 * Tensors on the client: typed arrays in, typed arrays out (spec protocol §2.7,
 * §3.2). Wire bytes are raw, C-contiguous, row-major and little-endian.
 *
 * @module
 */

import { type DType, DTYPE_ITEM_SIZES, isDType, tensorByteLength } from "../protocol/dtypes.ts";
import { ValidationError } from "./errors.ts";

/**
 * Typed-array data of a {@linkcode Tensor} (`Uint8Array` = raw bytes for dtypes without one).
 *
 * @example
 * ```ts
 * import { Tensor, type TensorData } from "./mod.ts";
 *
 * const data: TensorData = new Int32Array([1, 2]);
 * new Tensor("int32", [2], data);
 * ```
 */
export type TensorData =
  | Uint8Array
  | Int8Array
  | Int16Array
  | Int32Array
  | BigInt64Array
  | Float16Array
  | Float32Array
  | Float64Array;

/**
 * Anything with the three tensor fields, e.g. `{dtype: "bfloat16", shape: [2], data: bytes}`.
 *
 * @example
 * ```ts
 * import { Program, type TensorLike } from "./mod.ts";
 *
 * const bf16: TensorLike = { dtype: "bfloat16", shape: [2], data: new Uint8Array([0x80, 0x3f, 0, 0x40]) };
 * new Program().upload({ kind: "tensor", value: bf16 });
 * ```
 */
export interface TensorLike {
  /** One of the 12 wire dtypes. */
  dtype: string;
  /** Dimensions (non-negative integers). */
  shape: readonly number[];
  /** The elements (any typed array or DataView; its bytes are used as they are). */
  data: ArrayBufferView;
}

const _LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

type _TypedArrayConstructor = {
  new (buffer: ArrayBuffer, byteOffset: number, length: number): TensorData;
  readonly BYTES_PER_ELEMENT: number;
};

const _Float16Array: _TypedArrayConstructor | undefined =
  (globalThis as { Float16Array?: _TypedArrayConstructor }).Float16Array;

/** The typed array that holds each dtype (raw bytes when none exists). */
const _ARRAY_TYPES: Record<DType, _TypedArrayConstructor | undefined> = {
  bool: Uint8Array,
  uint8: Uint8Array,
  int8: Int8Array,
  int16: Int16Array,
  int32: Int32Array,
  int64: BigInt64Array,
  float16: _Float16Array,
  float32: Float32Array,
  float64: Float64Array,
  bfloat16: undefined,
  float8_e4m3fn: undefined,
  float8_e5m2: undefined,
};

/** The dtype of a typed array whose element type has a wire dtype (never Uint8Array). */
function _inferDType(value: ArrayBufferView): DType | undefined {
  if (value instanceof Float32Array) return "float32";
  if (value instanceof Float64Array) return "float64";
  if (value instanceof Int8Array) return "int8";
  if (value instanceof Int16Array) return "int16";
  if (value instanceof Int32Array) return "int32";
  if (value instanceof BigInt64Array) return "int64";
  if (_Float16Array !== undefined && value instanceof _Float16Array) return "float16";
  return undefined;
}

function _bytesOf(view: ArrayBufferView): Uint8Array {
  return new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
}

/** Swap each `size`-byte element (only ever needed on big-endian hosts). */
function _swapped(bytes: Uint8Array, size: number): Uint8Array {
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i += size) {
    for (let k = 0; k < size; k++) out[i + k] = bytes[i + size - 1 - k];
  }
  return out;
}

function _checkShape(shape: unknown): number[] {
  if (
    !Array.isArray(shape) ||
    !shape.every((d) => typeof d === "number" && Number.isSafeInteger(d) && d >= 0)
  ) {
    throw new ValidationError("tensor shape must be an array of non-negative integers");
  }
  return [...shape];
}

/**
 * A tensor: dtype, shape and elements. Returned tensors decode to this, with
 * `data` a typed array where one exists (`Float32Array` for float32,
 * `BigInt64Array` for int64, `Float16Array` for float16, `Uint8Array` of 0/1
 * for bool) and the raw little-endian bytes (`Uint8Array`) for bfloat16 and
 * the float8 types. It can also be uploaded.
 *
 * @example
 * ```ts
 * import { Tensor } from "./mod.ts";
 *
 * const t = new Tensor("float32", [2, 2], new Float32Array([1, 2, 3, 4]));
 * if (t.size !== 4 || t.bytes().length !== 16) throw new Error();
 * const raw = new Tensor("bfloat16", [1], new Uint8Array([0x80, 0x3f])); // 1.0
 * if (raw.data.length !== 2) throw new Error();
 * ```
 */
export class Tensor {
  /** Element type. */
  readonly dtype: DType;
  /** Dimensions. */
  readonly shape: readonly number[];
  /** Elements in row-major order (see the class description for the array type). */
  readonly data: TensorData;

  /**
   * Create a tensor. `data` must be the dtype's typed array or a `Uint8Array`
   * of raw little-endian bytes, of exactly `prod(shape) * itemsize` bytes.
   */
  constructor(dtype: DType, shape: readonly number[], data: TensorData) {
    if (!isDType(dtype)) throw new ValidationError(`unsupported tensor dtype: ${String(dtype)}`);
    const dims = _checkShape(shape);
    const arrayType = _ARRAY_TYPES[dtype];
    if (
      !(data instanceof Uint8Array) && (arrayType === undefined || !(data instanceof arrayType))
    ) {
      throw new TypeError(
        `tensor data for ${dtype} must be a Uint8Array or the dtype's typed array`,
      );
    }
    const expected = tensorByteLength(dtype, dims);
    if (data.byteLength !== expected) {
      throw new ValidationError(
        `tensor metadata expects ${expected} bytes, got ${data.byteLength}`,
      );
    }
    this.dtype = dtype;
    this.shape = Object.freeze(dims);
    this.data = data;
  }

  /** Number of elements, `prod(shape)`. */
  get size(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** The raw little-endian wire bytes (a view of `data` on little-endian hosts). */
  bytes(): Uint8Array {
    const bytes = _bytesOf(this.data);
    const size = DTYPE_ITEM_SIZES[this.dtype];
    return _LITTLE_ENDIAN || size === 1 || this.data instanceof Uint8Array
      ? bytes
      : _swapped(bytes, size);
  }

  /**
   * Decode wire bytes. The typed array views `bytes` when its offset is
   * aligned (little-endian hosts), else it is a copy.
   */
  static fromBytes(dtype: DType, shape: readonly number[], bytes: Uint8Array): Tensor {
    const arrayType = _ARRAY_TYPES[dtype];
    if (arrayType === undefined || arrayType === Uint8Array) return new Tensor(dtype, shape, bytes);
    const size = arrayType.BYTES_PER_ELEMENT;
    let source = bytes;
    if (!_LITTLE_ENDIAN) source = _swapped(bytes, size);
    else if (bytes.byteOffset % size !== 0) source = bytes.slice();
    const data = new arrayType(
      source.buffer as ArrayBuffer,
      source.byteOffset,
      source.byteLength / size,
    );
    return new Tensor(dtype, shape, data);
  }
}

/** A tensor upload's fields ({@linkcode tensorFields}): dtype, shape and a private copy of the wire bytes. */
export interface TensorFields {
  /** Element type. */
  dtype: DType;
  /** Dimensions. */
  shape: number[];
  /** Little-endian bytes (a snapshot). */
  bytes: Uint8Array;
}

/**
 * Turn an upload `value` (+ optional `dtype`/`shape`) into wire fields.
 *
 * - `Uint8Array`, `Uint8ClampedArray`, `ArrayBuffer`, `DataView`: raw bytes;
 *   `dtype` and `shape` are both required (`TypeError` otherwise).
 * - `Float32Array` → float32, `Float64Array` → float64, `Int8Array` → int8,
 *   `Int16Array` → int16, `Int32Array` → int32, `BigInt64Array` → int64,
 *   `Float16Array` → float16: `shape` defaults to `[length]` and may be any
 *   shape with as many elements; a given `dtype` must match.
 * - a {@linkcode Tensor} or any {@linkcode TensorLike} `{dtype, shape, data}`:
 *   a given `dtype`/`shape` must match.
 *
 * The bytes are copied, so later changes to `value` do not change the program.
 *
 * @example
 * ```ts
 * import { tensorFields } from "./tensor.ts";
 *
 * const fields = tensorFields(new Float32Array([1, 2, 3, 4]), undefined, [2, 2]);
 * if (fields.dtype !== "float32" || fields.bytes.length !== 16) throw new Error();
 * ```
 */
export function tensorFields(
  value: unknown,
  dtype?: string,
  shape?: readonly number[],
): TensorFields {
  let tensorDType: string;
  let tensorShape: number[];
  let raw: Uint8Array;
  if (
    value instanceof ArrayBuffer || value instanceof Uint8Array ||
    value instanceof Uint8ClampedArray || value instanceof DataView
  ) {
    if (dtype === undefined || shape === undefined) {
      throw new TypeError("raw tensor bytes require 'dtype' and 'shape'");
    }
    tensorDType = dtype;
    tensorShape = _checkShape(shape);
    raw = value instanceof ArrayBuffer ? new Uint8Array(value) : _bytesOf(value);
  } else if (ArrayBuffer.isView(value)) {
    const inferred = _inferDType(value);
    if (inferred === undefined) {
      throw new TypeError(
        `cannot upload '${value.constructor.name}' as a tensor; use {dtype, shape, data}`,
      );
    }
    if (dtype !== undefined && dtype !== inferred) {
      throw new ValidationError(
        `declared dtype '${dtype}' does not match value dtype '${inferred}'`,
      );
    }
    tensorDType = inferred;
    tensorShape = shape === undefined ? [(value as TensorData).length] : _checkShape(shape);
    raw = _bytesOf(value);
    if (!_LITTLE_ENDIAN) raw = _swapped(raw, DTYPE_ITEM_SIZES[inferred]);
  } else if (_isTensorLike(value)) {
    const bytes = value instanceof Tensor ? value.bytes() : _bytesOf(value.data);
    if (dtype !== undefined && dtype !== value.dtype) {
      throw new ValidationError(
        `declared dtype '${dtype}' does not match value dtype '${value.dtype}'`,
      );
    }
    const valueShape = _checkShape(value.shape);
    if (shape !== undefined && JSON.stringify([...shape]) !== JSON.stringify(valueShape)) {
      throw new ValidationError(
        `declared shape [${shape.join(", ")}] does not match value shape [${
          valueShape.join(", ")
        }]`,
      );
    }
    tensorDType = value.dtype;
    tensorShape = valueShape;
    raw = bytes;
  } else {
    const name = value === null
      ? "null"
      : typeof value === "object"
      ? (value.constructor?.name ?? "object")
      : typeof value;
    throw new TypeError(`cannot upload '${name}' as a tensor`);
  }
  if (!isDType(tensorDType)) {
    throw new ValidationError(`unsupported tensor dtype: '${tensorDType}'`);
  }
  const expected = tensorByteLength(tensorDType, tensorShape);
  if (raw.length !== expected) {
    throw new ValidationError(`tensor metadata expects ${expected} bytes, got ${raw.length}`);
  }
  return { dtype: tensorDType, shape: tensorShape, bytes: raw.slice() };
}

function _isTensorLike(value: unknown): value is TensorLike {
  if (value instanceof Tensor) return true;
  if (typeof value !== "object" || value === null) return false;
  const candidate = value as Partial<TensorLike>;
  return typeof candidate.dtype === "string" && Array.isArray(candidate.shape) &&
    ArrayBuffer.isView(candidate.data);
}
