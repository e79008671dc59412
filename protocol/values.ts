/**
 * Result-value codec (spec protocol §3.2): decoding of `results` entries with exact field sets,
 * depth-first `return:k` numbering in JSON text order, hash verification and folder manifest rules,
 * with upstream's messages.
 *
 * @module
 */

import { JsonFloat } from "./json_float.ts";
import type { TypedJsonObject, TypedJsonValue } from "./json.ts";
import { type DType, isDType, tensorByteLength } from "./dtypes.ts";
import { isBlobHash } from "./program.ts";
import { normalizeFilePath, PathError } from "./paths.ts";
import { sha256Hex } from "./hash.ts";
import { pyListRepr, pyRepr, pyStrRepr } from "./python_repr.ts";
import { comparePy, pySorted } from "./python_str.ts";
import type { KeptNode } from "./kept_returns.ts";

/** A malformed encoded value; `message` is upstream's text (without the response prefix). */
export class ResultValueError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string) {
    super(message);
    this.name = "ResultValueError";
  }
}

/** Builds the caller's objects for binary values once they are verified. */
export interface ValueFactories<T> {
  /** A `tensor` node: verified bytes of length `prod(shape) * itemsize`. */
  tensor(dtype: DType, shape: number[], data: Uint8Array): T;
  /** A `bytes` node, with the SHA-256 (lowercase hex) its bytes were verified against. */
  bytes(data: Uint8Array, sha256: string): T;
  /** A `file` node (its `size` already checked). */
  file(data: Uint8Array): T;
  /** A `folder` node: files in (sorted) manifest order, sorted directories. */
  folder(files: Map<string, T>, directories: string[]): T;
  /**
   * A `kept` node (protocol/kept_returns.ts), valid only in the answer to a request that asked for
   * kept returns: without this factory the node is refused as an unknown type.
   */
  kept?(node: KeptNode): T;
}

/**
 * A decoded value: `null`, booleans, integers (`number`, or `bigint` beyond ±(2^53-1)), numbers,
 * strings, arrays, objects as `Map`s (keys in response order), or what the factories built for
 * binary nodes.
 *
 * @example
 * ```ts
 * import type { DecodedValue } from "../mod.ts";
 *
 * const value: DecodedValue<never> = new Map([["n", 1n << 64n]]);
 * ```
 */
export type DecodedValue<T> =
  | null
  | boolean
  | number
  | bigint
  | string
  | DecodedValue<T>[]
  | Map<string, DecodedValue<T>>
  | T;

/** The type check of each scalar node's `value`. */
const _SCALARS: Record<string, (value: unknown) => boolean> = {
  boolean: (value) => typeof value === "boolean",
  integer: (value) => typeof value === "number" || typeof value === "bigint",
  string: (value) => typeof value === "string",
};

function _fail(message: string): never {
  throw new ResultValueError(message);
}

/** The SHA-256 (lowercase hex) of exactly these bytes if already known, else `undefined`. */
export type KnownDigest = (part: Uint8Array) => string | undefined;

/** Decoding state shared by all values of one response. */
export class ValueDecoder<T> {
  readonly #parts: ReadonlyMap<string, Uint8Array>;
  readonly #factories: ValueFactories<T>;
  readonly #used = new Set<string>();
  readonly #knownDigest: KnownDigest | undefined;

  /**
   * Decode against the response's binary parts (`return:<i>` → bytes). `knownDigest` may supply the
   * SHA-256 of a part computed while it was received (else the part is hashed here).
   */
  constructor(
    parts: ReadonlyMap<string, Uint8Array>,
    factories: ValueFactories<T>,
    knownDigest?: KnownDigest,
  ) {
    this.#parts = parts;
    this.#factories = factories;
    this.#knownDigest = knownDigest;
  }

  /** Binary part names used so far. */
  get usedParts(): ReadonlySet<string> {
    return this.#used;
  }

  /** Part names received but never referenced, sorted (upstream rejects any). */
  unreferencedParts(): string[] {
    return pySorted([...this.#parts.keys()].filter((name) => !this.#used.has(name)));
  }

  /**
   * Decode one encoded node. Call in JSON text order: binary nodes must be numbered `return:0`,
   * `return:1`, … in that depth-first order.
   *
   * @throws {ResultValueError}
   */
  decode(encoded: TypedJsonValue): DecodedValue<T> {
    if (!(encoded instanceof Map) || typeof encoded.get("type") !== "string") {
      _fail("encoded values must be objects with a type");
    }
    const type = encoded.get("type") as string;
    switch (type) {
      case "null":
        _expectFields(encoded, ["type"]);
        return null;
      case "boolean":
      case "integer":
      case "string": {
        _expectFields(encoded, ["type", "value"]);
        const value = encoded.get("value");
        if (!_SCALARS[type](value)) _fail(`${type} value has the wrong type`);
        return value as boolean | number | bigint | string;
      }
      case "number": {
        _expectFields(encoded, ["type", "value"]);
        const value = _finiteNumber(encoded.get("value"));
        if (value === undefined) _fail("number value has the wrong type");
        return value;
      }

      case "array": {
        _expectFields(encoded, ["type", "value"]);
        const value = encoded.get("value");
        if (!Array.isArray(value)) _fail("array value has the wrong type");
        return value.map((child) => this.decode(child));
      }
      case "object": {
        _expectFields(encoded, ["type", "value"]);
        const value = encoded.get("value");
        if (!(value instanceof Map)) _fail("object value has the wrong type");
        const out = new Map<string, DecodedValue<T>>();
        for (const [key, child] of value) out.set(key, this.decode(child));
        return out;
      }
      case "bytes":
        _expectFields(encoded, ["type", "part", "sha256"]);
        return this.#factories.bytes(this.#binaryPart(encoded), encoded.get("sha256") as string);
      case "kept":
        if (this.#factories.kept === undefined) _fail(`unknown encoded value type: 'kept'`);
        return this.#factories.kept(_kept(encoded));
      case "file":
        return this.#factories.file(this.#file(encoded));
      case "folder":
        return this.#folder(encoded);
      case "tensor": {
        _expectFields(encoded, ["type", "dtype", "shape", "part", "sha256"]);
        const meta = _tensorMeta(encoded);
        if (meta === null) _fail("tensor metadata is invalid");
        const [dtype, dims] = meta;
        const data = this.#binaryPart(encoded);
        if (data.length !== tensorByteLength(dtype, dims)) {
          _fail("tensor binary length does not match dtype and shape");
        }
        return this.#factories.tensor(dtype, dims, data);
      }
      default:
        _fail(`unknown encoded value type: ${pyStrRepr(type)}`);
    }
  }

  #file(encoded: TypedJsonObject): Uint8Array {
    _expectFields(encoded, ["type", "size", "part", "sha256"]);
    const size = encoded.get("size");
    if ((typeof size !== "number" && typeof size !== "bigint") || size < 0) {
      _fail("file size must be a non-negative integer");
    }
    const data = this.#binaryPart(encoded);
    if (data.length !== Number(size)) _fail("file binary length does not match size");
    return data;
  }

  #folder(encoded: TypedJsonObject): T {
    _expectFields(encoded, ["type", "files", "directories"]);
    const files = encoded.get("files");
    const directories = encoded.get("directories");
    if (!(files instanceof Map) || !Array.isArray(directories)) {
      _fail("folder files/directories have the wrong type");
    }
    validateManifest([...files.keys()], directories);
    for (const child of files.values()) {
      if (!(child instanceof Map) || child.get("type") !== "file") {
        _fail("folder files must contain file values");
      }
    }
    const decoded = new Map<string, T>();
    for (const [path, child] of files) {
      decoded.set(path, this.#factories.file(this.#file(child as TypedJsonObject)));
    }
    return this.#factories.folder(decoded, directories as string[]);
  }

  #binaryPart(encoded: TypedJsonObject): Uint8Array {
    const name = encoded.get("part");
    const hash = encoded.get("sha256");
    if (typeof name !== "string" || !name.startsWith("return:")) {
      _fail("binary value has an invalid part name");
    }
    if (!/^return:(0|[1-9][0-9]*)$/.test(name)) _fail("binary value has an invalid part index");
    if (name !== `return:${this.#used.size}`) {
      _fail("binary values are not numbered in depth-first order");
    }
    if (!isBlobHash(hash)) _fail("binary value has an invalid SHA-256 digest");
    const data = this.#parts.get(name);
    if (data === undefined) _fail(`missing binary response part: ${pyStrRepr(name)}`);
    const actual = this.#knownDigest?.(data) ?? sha256Hex(data);
    if (actual !== hash) _fail(`blob hash mismatch: declared ${hash}, computed ${actual}`);
    this.#used.add(name);
    return data;
  }
}

/** A `kept` node's fields, checked: a known kind, a digest, a size (a tensor's matching it). */
function _kept(encoded: TypedJsonObject): KeptNode {
  const kind = encoded.get("kind");
  const tensor = kind === "tensor";
  if (kind !== "bytes" && !tensor) _fail("kept value has an invalid kind");
  _expectFields(
    encoded,
    tensor
      ? ["type", "kind", "sha256", "size", "dtype", "shape"]
      : ["type", "kind", "sha256", "size"],
  );
  const sha256 = encoded.get("sha256");
  const size = encoded.get("size");
  if (!isBlobHash(sha256)) _fail("kept value has an invalid SHA-256 digest");
  if (typeof size !== "number" || !Number.isSafeInteger(size) || size < 0) {
    _fail("kept value size must be a non-negative integer");
  }
  if (!tensor) return { kind: "bytes", sha256, size };
  const meta = _tensorMeta(encoded);
  if (meta === null) _fail("kept tensor metadata is invalid");
  const [dtype, shape] = meta;
  if (tensorByteLength(dtype, shape) !== size) {
    _fail("kept tensor size does not match dtype and shape");
  }
  return { kind: "tensor", sha256, size, dtype, shape };
}

/** `dtype` and `shape` when valid (a bigint dimension makes no array here, even if empty). */
function _tensorMeta(encoded: TypedJsonObject): [DType, number[]] | null {
  const dtype = encoded.get("dtype");
  const shape = encoded.get("shape");
  const valid = isDType(dtype) && Array.isArray(shape) &&
    shape.every((d) => typeof d === "number" && Number.isSafeInteger(d) && d >= 0);
  return valid ? [dtype, shape as number[]] : null;
}

function _finiteNumber(value: TypedJsonValue | undefined): number | undefined {
  const number = value instanceof JsonFloat
    ? value.value
    : typeof value === "number" || typeof value === "bigint"
    ? Number(value)
    : undefined;
  return number !== undefined && Number.isFinite(number) ? number : undefined;
}

function _expectFields(value: TypedJsonObject, expected: string[]): void {
  if (value.size === expected.length && expected.every((key) => value.has(key))) return;
  _fail(
    `encoded ${pyRepr(value.get("type"))} value has fields ${
      pyListRepr(pySorted(value.keys()))
    }, expected ${pyListRepr(pySorted(expected))}`,
  );
}

/**
 * Check a folder manifest (spec §3.2): canonical relative paths (§2.6), `files` keys and
 * `directories` each sorted (code-point order), no duplicates or names used as both file and
 * directory, and every entry's parent listed in `directories`.
 *
 * @throws {ResultValueError} with upstream's message.
 */
export function validateManifest(
  files: readonly string[],
  directories: readonly TypedJsonValue[],
): void {
  const names = [...files, ...directories];
  for (const name of names) {
    let normalized: string;
    try {
      normalized = normalizeFilePath(name);
    } catch (error) {
      if (error instanceof PathError) _fail(error.message);
      throw error;
    }
    if (normalized !== name) _fail("folder paths must be canonical relative POSIX paths");
  }
  const dirs = directories as string[];
  if (!_isSorted(files) || !_isSorted(dirs)) _fail("folder entries must be sorted");
  if (new Set(names).size !== names.length) _fail("folder contains duplicate or conflicting paths");
  const directorySet = new Set(dirs);
  for (const name of names as string[]) {
    const slash = name.lastIndexOf("/");
    if (slash > 0 && !directorySet.has(name.slice(0, slash))) {
      _fail(`folder entry has a missing or conflicting parent: ${pyStrRepr(name)}`);
    }
  }
}

function _isSorted(items: readonly string[]): boolean {
  for (let i = 1; i < items.length; i++) if (comparePy(items[i - 1], items[i]) > 0) return false;
  return true;
}
