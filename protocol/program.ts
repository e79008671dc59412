/**
 * Program JSON validation (spec protocol §2.3–§2.7), message for message as upstream
 * `parse_program`. The types of what it reports are in `program_types.ts`.
 *
 * @module
 */

import { JsonFloat } from "./json_float.ts";
import { JsonParseError, parseJsonTyped, type TypedJsonValue } from "./json.ts";

/**
 * Python's default `sys.get_int_max_str_digits()`: a program with a longer integer is refused as
 * upstream's parser refuses it (a worker could not read it either).
 */
const PYTHON_INT_DIGITS = 4300;
import { pyRepr, pyStrRepr } from "./python_repr.ts";
import { pySorted } from "./python_str.ts";
import { checkPathConflicts, normalizeFilePath, PathError } from "./paths.ts";
import { isDType, tensorByteLength } from "./dtypes.ts";
import type {
  BlobReference,
  BlobUse,
  InstructionSummary,
  ParsedProgram,
  ProgramOptions,
  TensorUpload,
} from "./program_types.ts";

/**
 * An invalid program; `message` is upstream's exact 400 text.
 *
 * @example
 * ```ts
 * import { parseProgram, ProgramError } from "../mod.ts";
 *
 * try {
 *   parseProgram('{"instructions":[]}');
 * } catch (error) {
 *   if (!(error instanceof ProgramError)) throw error;
 *   if (error.message !== "'instructions' must be a non-empty array") throw error;
 * }
 * ```
 */
export class ProgramError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ProgramError";
  }
}

type _Obj = Map<string, TypedJsonValue>;

const _BLOB_HASH = /^[0-9a-f]{64}$/;

/** Whether `value` is a lowercase hex SHA-256 digest (`^[0-9a-f]{64}$`). */
export function isBlobHash(value: unknown): value is string {
  return typeof value === "string" && value.length === 64 && _BLOB_HASH.test(value);
}

/**
 * Parse the program part: strict JSON, then the full schema of spec §2.3–§2.7 — exact field sets
 * (unknown fields reported before missing ones, both as sorted lists), references to earlier
 * handles only, return keys in their own namespace, literal paths normalized, file-upload path
 * conflicts, options validation.
 *
 * @throws {ProgramError} with upstream's exact message, which names the instruction index and the
 * field.
 *
 * @example
 * ```ts
 * import { parseProgram, ProgramError } from "./mod.ts";
 *
 * const program = parseProgram(
 *   '{"instructions":[{"op":"upload","kind":"module","source":"x = 1","id":"m"}]}',
 * );
 * if (program.uploads.module !== 1) throw new Error();
 *
 * try {
 *   parseProgram('{"instructions":[{"op":"run","id":"r","fn":{"$ref":"m"}}]}');
 * } catch (error) {
 *   if (!(error instanceof ProgramError)) throw error;
 *   if (error.message !== "'r' references unknown/forward handle 'm'") throw error;
 * }
 * ```
 */
export function parseProgram(text: string | Uint8Array): ParsedProgram {
  try {
    return _validate(parseJsonTyped(text, { maxIntDigits: PYTHON_INT_DIGITS }));
  } catch (error) {
    if (error instanceof JsonParseError || error instanceof PathError) {
      throw new ProgramError(error.message, { cause: error });
    }
    throw error;
  }
}

function _fail(message: string): never {
  throw new ProgramError(message);
}

function _validate(body: TypedJsonValue): ParsedProgram {
  if (!(body instanceof Map)) _fail("program must be a JSON object");
  _checkFields(body, ["instructions", "options"], ["instructions"], "program");
  const raw = body.get("instructions");
  if (!Array.isArray(raw) || raw.length === 0) _fail("'instructions' must be a non-empty array");
  const options = _parseOptions(body.has("options") ? body.get("options")! : new Map());

  const state: _State = {
    handles: new Set(),
    returnKeys: new Set(),
    filePaths: [],
    tensorUploads: [],
    blobs: new Map(),
    ops: {},
    uploads: {},
  };
  const instructions: InstructionSummary[] = [];
  for (let index = 0; index < raw.length; index++) {
    const item = raw[index];
    if (!(item instanceof Map)) _fail(`instruction ${index} must be an object`);
    const op = item.get("op");
    if (op === "return") {
      const key = _parseReturn(item, index, state);
      state.returnKeys.add(key);
    } else if (op === "upload" || op === "get_function" || op === "run") {
      const id = item.get("id");
      if (typeof id !== "string" || id.length === 0) {
        _fail(`instruction ${index} needs a non-empty string 'id'`);
      }
      if (state.handles.has(id)) _fail(`duplicate instruction id: ${pyStrRepr(id)}`);
      if (op === "upload") _parseUpload(item, index, id, state);
      else if (op === "get_function") _parseGetFunction(item, index, id, state);
      else _parseRun(item, index, id, state);
      state.handles.add(id);
    } else {
      _fail(`instruction ${index}: unknown op ${pyRepr(op)}`);
    }
    state.ops[op] = (state.ops[op] ?? 0) + 1;
    instructions.push({ op, id: op === "return" ? null : item.get("id") as string });
  }
  checkPathConflicts(state.filePaths);
  return {
    instructionCount: raw.length,
    ops: state.ops,
    uploads: state.uploads,
    instructions,
    options,
    blobs: [...state.blobs.values()],
    filePaths: state.filePaths,
    tensorUploads: state.tensorUploads,
    leaseFirst: _takesLease(raw[0] as Map<string, TypedJsonValue>),
  };
}

function _takesLease(first: Map<string, TypedJsonValue>): boolean {
  const kind = first.get("kind");
  return first.get("op") === "upload" &&
    (kind === "module" || kind === "tensor" || kind === "library");
}

interface _State {
  handles: Set<string>;
  returnKeys: Set<string>;
  filePaths: string[];
  tensorUploads: TensorUpload[];
  blobs: Map<string, BlobReference>;
  ops: Record<string, number>;
  uploads: Record<string, number>;
}

function _checkFields(
  value: _Obj,
  allowed: readonly string[],
  required: readonly string[],
  label: string,
): void {
  const unknown = [...value.keys()].filter((key) => !allowed.includes(key));
  if (unknown.length > 0) {
    _fail(`${label} has unknown field(s): ${pySorted(unknown).join(", ")}`);
  }
  const missing = required.filter((key) => !value.has(key));
  if (missing.length > 0) {
    _fail(`${label} is missing field(s): ${pySorted(missing).join(", ")}`);
  }
}

function _isInt(value: TypedJsonValue | undefined): value is number | bigint {
  return typeof value === "number" || typeof value === "bigint";
}

function _parseOptions(value: TypedJsonValue): ProgramOptions {
  if (!(value instanceof Map)) _fail("'options' must be an object");
  _checkFields(value, ["timeout_seconds", "output_limit_bytes", "gpu_count"], [], "options");
  const options: ProgramOptions = {};
  if (value.has("gpu_count")) {
    const count = value.get("gpu_count");
    if (!_isInt(count) || count < 1 || count > 8) {
      _fail("'gpu_count' must be an integer between 1 and 8");
    }
    options.gpuCount = Number(count);
  }
  if (value.has("timeout_seconds")) {
    const timeout = value.get("timeout_seconds");
    // Integers are exact (a huge one is clamped by the server); floats must be finite.
    const seconds = _isInt(timeout)
      ? Number(timeout)
      : timeout instanceof JsonFloat && Number.isFinite(timeout.value)
      ? timeout.value
      : NaN;
    if (!(seconds > 0)) _fail("'timeout_seconds' must be a finite positive number");
    options.timeoutSeconds = seconds;
  }
  if (value.has("output_limit_bytes")) {
    const limit = value.get("output_limit_bytes");
    if (!_isInt(limit) || limit < 0) _fail("'output_limit_bytes' must be a non-negative integer");
    options.outputLimitBytes = Number(limit);
  }
  return options;
}

function _addBlob(state: _State, sha256: string, use: BlobUse, tensorBytes?: number): void {
  let reference = state.blobs.get(sha256);
  if (reference === undefined) {
    reference = { sha256, uses: new Set(), tensorByteLengths: [] };
    state.blobs.set(sha256, reference);
  }
  reference.uses.add(use);
  if (tensorBytes !== undefined) reference.tensorByteLengths.push(tensorBytes);
}

function _parseUpload(item: _Obj, index: number, id: string, state: _State): void {
  const kind = item.get("kind");
  const label = `instruction ${index}`;
  const rid = pyStrRepr(id);
  if (kind === "file") {
    _checkFields(item, _FILE_UPLOAD, _FILE_UPLOAD, label);
    const blob = item.get("blob");
    if (!isBlobHash(blob)) _fail("file upload: 'blob' must be a lowercase SHA-256 digest");
    state.filePaths.push(normalizeFilePath(item.get("path")));
    _addBlob(state, blob, "file");
  } else if (kind === "module") {
    _checkFields(item, _MODULE_UPLOAD, _MODULE_UPLOAD, label);
    if (typeof item.get("source") !== "string") {
      _fail(`module upload ${rid}: 'source' must be a string`);
    }
  } else if (kind === "tensor") {
    _checkFields(item, _TENSOR_UPLOAD, _TENSOR_UPLOAD, label);
    const blob = item.get("blob");
    const dtype = item.get("dtype");
    const shape = item.get("shape");
    if (!isBlobHash(blob)) {
      _fail(`tensor upload ${rid}: 'blob' must be a lowercase SHA-256 digest`);
    }
    if (!isDType(dtype)) _fail(`tensor upload ${rid}: unsupported dtype ${pyRepr(dtype)}`);
    if (!Array.isArray(shape) || !shape.every((d) => _isInt(d) && d >= 0)) {
      _fail(`tensor upload ${rid}: 'shape' must be an array of non-negative integers`);
    }
    const byteLength = tensorByteLength(dtype, shape as (number | bigint)[]);
    _addBlob(state, blob, "tensor", byteLength);
    state.tensorUploads.push({
      id,
      sha256: blob,
      dtype,
      shape: shape as (number | bigint)[],
      byteLength,
    });
  } else if (kind === "bytes" || kind === "library") {
    _checkFields(item, _BLOB_UPLOAD, _BLOB_UPLOAD, label);
    const blob = item.get("blob");
    if (!isBlobHash(blob)) {
      _fail(`${kind} upload ${rid}: 'blob' must be a lowercase SHA-256 digest`);
    }
    _addBlob(state, blob, kind);
  } else {
    _fail(`upload ${rid}: unknown kind ${pyRepr(kind)}`);
  }
  state.uploads[kind] = (state.uploads[kind] ?? 0) + 1;
}

const _FILE_UPLOAD = ["op", "id", "kind", "blob", "path"];
const _MODULE_UPLOAD = ["op", "id", "kind", "source"];
const _TENSOR_UPLOAD = ["op", "id", "kind", "blob", "dtype", "shape"];
const _BLOB_UPLOAD = ["op", "id", "kind", "blob"];

function _isRef(value: TypedJsonValue | undefined): value is Map<string, string> {
  if (!(value instanceof Map) || value.size !== 1) return false;
  const target = value.get("$ref");
  return typeof target === "string" && target.length > 0;
}

function _resolveRef(reference: Map<string, string>, state: _State, owner: string): void {
  const target = reference.get("$ref")!;
  if (!state.handles.has(target)) {
    _fail(`${pyStrRepr(owner)} references unknown/forward handle ${pyStrRepr(target)}`);
  }
}

function _parseGetFunction(item: _Obj, index: number, id: string, state: _State): void {
  _checkFields(
    item,
    ["op", "id", "module", "name", "cpu_only"],
    ["op", "id", "module", "name"],
    `instruction ${index}`,
  );
  const rid = pyStrRepr(id);
  const module = item.get("module");
  if (!_isRef(module)) _fail(`get_function ${rid}: 'module' must be {'$ref': id}`);
  const name = item.get("name");
  if (typeof name !== "string" || name.length === 0) {
    _fail(`get_function ${rid}: 'name' must be a non-empty string`);
  }
  if (item.has("cpu_only") && typeof item.get("cpu_only") !== "boolean") {
    _fail(`get_function ${rid}: 'cpu_only' must be a boolean`);
  }
  _resolveRef(module, state, id);
}

function _parseRun(item: _Obj, index: number, id: string, state: _State): void {
  _checkFields(item, ["op", "id", "fn", "args"], ["op", "id", "fn"], `instruction ${index}`);
  const rid = pyStrRepr(id);
  const fn = item.get("fn");
  if (!_isRef(fn)) _fail(`run ${rid}: 'fn' must be {'$ref': id}`);
  _resolveRef(fn, state, id);
  const args = item.has("args") ? item.get("args") : [];
  if (!Array.isArray(args)) _fail(`run ${rid}: 'args' must be an array`);
  for (const argument of args) {
    // Only a top-level argument is a reference; nested ones stay literals.
    if (_isRef(argument)) _resolveRef(argument, state, id);
    else if (!_allFinite(argument)) _fail(`run ${rid} argument contains a non-finite number`);
  }
}

function _allFinite(value: TypedJsonValue): boolean {
  if (value instanceof JsonFloat) return Number.isFinite(value.value);
  if (Array.isArray(value)) return value.every(_allFinite);
  if (value instanceof Map) {
    for (const child of value.values()) if (!_allFinite(child)) return false;
  }
  return true;
}

function _parseReturn(item: _Obj, index: number, state: _State): string {
  const fields = item.has("kind") ? ["op", "key", "kind", "path"] : ["op", "key", "value"];
  _checkFields(item, fields, fields, `instruction ${index}`);
  const key = item.get("key");
  if (typeof key !== "string" || key.length === 0) {
    _fail(`return instruction ${index} needs a non-empty string 'key'`);
  }
  const rkey = pyStrRepr(key);
  if (state.returnKeys.has(key)) _fail(`duplicate return key: ${rkey}`);
  if (item.has("kind")) {
    const kind = item.get("kind");
    if (kind !== "file" && kind !== "folder") {
      _fail(`return ${rkey}: unknown kind ${pyRepr(kind)}`);
    }
    const path = item.get("path");
    if (_isRef(path)) _resolveRef(path, state, `return ${rkey}`);
    else normalizeFilePath(path);
    return key;
  }
  const value = item.get("value");
  if (!_isRef(value)) _fail(`return ${rkey}: 'value' must be {'$ref': id}`);
  _resolveRef(value, state, `return ${rkey}`);
  return key;
}
