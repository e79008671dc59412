/**
 * Encoding of upload values for the program builder (spec protocol §5.2): the per-kind
 * instruction fields and blob of {@linkcode encodeUpload} (`module`, `tensor`, `bytes`,
 * `library`), snapshots of bytes-like values, and workspace-relative paths. Everything is
 * validated and copied before the builder changes anything, except bytes their holder adopted
 * (client/_known_digests.ts: never changed again, their digest known), which are used as they
 * are.
 *
 * @module
 */

import { sha256Hex } from "../protocol/hash.ts";
import { normalizeFilePath, PathError } from "../protocol/paths.ts";
import { ValidationError } from "./errors.ts";
import type { UploadOptions } from "./program_options.ts";
import { tensorFields } from "./tensor.ts";
import { adoptedDigest } from "./_known_digests.ts";
import { KeptReturn } from "./kept_return.ts";
import { isDType, tensorByteLength } from "../protocol/dtypes.ts";

/**
 * A private copy of a bytes-like value (`ArrayBuffer`, `SharedArrayBuffer` or any
 * `ArrayBufferView`); anything else is a `TypeError` with `message`.
 *
 * @example
 * ```ts
 * import { bytesLike } from "./uploads.ts";
 *
 * const source = new Uint16Array([1]);
 * const copy = bytesLike(source, "not bytes");
 * source[0] = 2;
 * if (copy.length !== 2 || copy[0] !== 1) throw new Error();
 * ```
 */
export function bytesLike(value: unknown, message: string): Uint8Array {
  if (value instanceof ArrayBuffer || value instanceof SharedArrayBuffer) {
    return new Uint8Array(value).slice();
  }
  if (ArrayBuffer.isView(value)) {
    return new Uint8Array(value.buffer, value.byteOffset, value.byteLength).slice();
  }
  throw new TypeError(message);
}

/**
 * A normalized workspace-relative path (spec §2.6); a path breaking the rules is a
 * `ValidationError` with upstream's message.
 *
 * @example
 * ```ts
 * import { workspacePath } from "./uploads.ts";
 *
 * if (workspacePath("./inputs//a.txt") !== "inputs/a.txt") throw new Error();
 * ```
 */
export function workspacePath(path: unknown): string {
  try {
    return normalizeFilePath(path);
  } catch (error) {
    if (error instanceof PathError) throw new ValidationError(error.message, { cause: error });
    throw error;
  }
}

/** An upload instruction without its id, and the blob it names (none for `module`). */
export interface EncodedUpload {
  /** `op`, `kind` and the kind's fields, in wire order. */
  instruction: Record<string, unknown>;
  /** `[SHA-256, bytes]` of the blob (a private copy, or the adopted bytes themselves). */
  blob?: [string, Uint8Array];
}

/**
 * The instruction fields and blob of an upload of kind `module`, `tensor`, `bytes` or
 * `library` (see {@linkcode UploadOptions} for the accepted values).
 *
 * @throws {TypeError} for a value of the wrong type or fields the kind does not take.
 * @throws {ValidationError} for an unknown kind or an invalid tensor.
 *
 * @example
 * ```ts
 * import { encodeUpload } from "./uploads.ts";
 *
 * const { instruction, blob } = encodeUpload({ kind: "bytes", value: new Uint8Array([1]) });
 * if (instruction.blob !== blob?.[0] || blob?.[1][0] !== 1) throw new Error();
 * ```
 */
export function encodeUpload(options: UploadOptions): EncodedUpload {
  const { kind } = options;
  const source = options.source ?? undefined;
  const value = options.value ?? undefined;
  const dtype = options.dtype ?? undefined;
  const shape = options.shape ?? undefined;
  if (kind === "module") {
    if (typeof source !== "string") throw new TypeError("module upload requires string 'source'");
    if (value !== undefined || dtype !== undefined || shape !== undefined) {
      throw new TypeError("module upload does not accept tensor fields");
    }
    return { instruction: { op: "upload", kind: "module", source } };
  }
  if (value instanceof KeptReturn) {
    if (source !== undefined) throw new TypeError(`${kind} upload does not accept 'source'`);
    return { instruction: _keptUpload(kind, value, dtype, shape) };
  }
  if (kind === "tensor") {
    if (source !== undefined) throw new TypeError("tensor upload does not accept 'source'");
    const fields = tensorFields(value, dtype, shape);
    const hash = sha256Hex(fields.bytes);
    return {
      instruction: {
        op: "upload",
        kind: "tensor",
        blob: hash,
        dtype: fields.dtype,
        shape: Object.freeze(fields.shape),
      },
      blob: [hash, fields.bytes],
    };
  }
  if (kind === "bytes" || kind === "library") {
    if (source !== undefined) throw new TypeError(`${kind} upload does not accept 'source'`);
    if (dtype !== undefined || shape !== undefined) {
      throw new TypeError(`${kind} upload does not accept tensor fields`);
    }
    // Bytes their holder handed over for good (client/_known_digests.ts): no copy, no hash.
    const adopted = value instanceof Uint8Array ? adoptedDigest(value) : undefined;
    const bytes = adopted === undefined
      ? bytesLike(value, `${kind} upload requires a bytes-like 'value'`)
      : value as Uint8Array;
    const hash = adopted ?? sha256Hex(bytes);
    return { instruction: { op: "upload", kind, blob: hash }, blob: [hash, bytes] };
  }
  throw new ValidationError("upload kind must be 'module', 'tensor', 'bytes', or 'library'");
}

/**
 * The upload of a value the server kept (client/kept_return.ts): its blob named, no bytes. A
 * tensor takes a kept tensor's dtype and shape (given ones must match), or, for kept bytes, a
 * dtype and shape of exactly its size.
 */
function _keptUpload(
  kind: string,
  kept: KeptReturn,
  dtype: string | undefined,
  shape: readonly number[] | undefined,
): Record<string, unknown> {
  if (kind === "bytes" || kind === "library") {
    if (dtype !== undefined || shape !== undefined) {
      throw new TypeError(`${kind} upload does not accept tensor fields`);
    }
    return { op: "upload", kind, blob: kept.sha256 };
  }
  if (kind !== "tensor") {
    throw new ValidationError("upload kind must be 'module', 'tensor', 'bytes', or 'library'");
  }
  const wireDType = dtype ?? kept.dtype ?? undefined;
  const wireShape = shape ?? kept.shape ?? undefined;
  if (!isDType(wireDType) || wireShape === undefined) {
    throw new ValidationError("a tensor upload of kept bytes needs its dtype and shape");
  }
  const dims = [...wireShape];
  if (
    !dims.every((d) => Number.isSafeInteger(d) && d >= 0) ||
    tensorByteLength(wireDType, dims) !== kept.size ||
    (kept.dtype !== null && kept.dtype !== wireDType)
  ) {
    throw new ValidationError(
      `kept value of ${kept.size} bytes${kept.dtype ? ` (${kept.dtype})` : ""} is not a ` +
        `${wireDType} tensor of shape [${dims.join(", ")}]`,
    );
  }
  return {
    op: "upload",
    kind: "tensor",
    blob: kept.sha256,
    dtype: wireDType,
    shape: Object.freeze(dims),
  };
}
