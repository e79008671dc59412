/**
 * The client-side program builder (spec protocol §5.2), mirroring upstream's
 * `Program` instruction for instruction. Every method validates everything
 * before it changes anything, so a failed call leaves the program unchanged.
 *
 * It stays one module over 400 lines because the {@linkcode Program} builder is one public
 * class, each of its methods one instruction kind.
 *
 * @module
 */

import { fileURLToPath } from "node:url";
import { sha256Hex } from "../protocol/hash.ts";
import { noteBlobs, noteUnscanned, unscannedBlobs } from "./_blob_boundary.ts";
import { adoptedDigest } from "./_known_digests.ts";
import { stringifyJson } from "../protocol/json_stringify.ts";
import { checkPathConflicts, PathError } from "../protocol/paths.ts";
import { pyRepr, pyStrRepr } from "../protocol/python_repr.ts";
import { comparePy } from "../protocol/python_str.ts";
import { folderFiles } from "./_folder_files.ts";
import { ValidationError } from "./errors.ts";
import { jsonLiteral } from "./_json_literal.ts";
import type {
  ExecuteOptions,
  GetFunctionOptions,
  Instruction,
  Ref,
  ReturnOptions,
  ReturnPathOptions,
  RunOptions,
  UploadFileOptions,
  UploadOptions,
} from "./program_options.ts";
import { Register } from "./register.ts";
import { bytesLike, encodeUpload, workspacePath } from "./uploads.ts";

function _isRefObject(value: unknown): value is Ref {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) return false;
  const keys = Object.keys(value);
  return keys.length === 1 && keys[0] === "$ref" &&
    typeof (value as Record<string, unknown>).$ref === "string";
}

function _ref(id: string): Ref {
  return Object.freeze({ $ref: id });
}

/**
 * An ordered, self-contained list of instructions for one request. Building
 * never contacts a server; uploads snapshot their input; `Client.execute`
 * sends it. Values an instruction produces are {@linkcode Register}s; only
 * values selected with `return_`/`returnFile`/`returnFolder` come back.
 *
 * Ids default to `<op>_<n>` (`upload_0`, `get_function_1`, `run_2`, …) from
 * one counter shared by all ops, skipping ids already taken; explicit ids
 * never move the counter. Invalid input raises `TypeError` (wrong type) or
 * {@linkcode ValidationError} (bad value), and leaves the program unchanged.
 *
 * @example The worked example of the protocol spec (§10)
 * ```ts
 * import { Program } from "./mod.ts";
 *
 * const p = new Program();
 * const mod = p.upload({ kind: "module", source: "def add_one(x):\n    return x + 1\n" });
 * const fn = p.getFunction({ module: mod, name: "add_one" });
 * const x = p.upload({ kind: "tensor", value: new Float32Array([1, 2, 3, 4]), shape: [4] });
 * const y = p.run({ fn, args: [x] });
 * p.return_({ key: "y", value: y });
 * if (y.id !== "run_3" || p.instructions.length !== 5) throw new Error();
 * ```
 */
export class Program {
  #instructions: Instruction[] = [];
  #blobs = new Map<string, Uint8Array>();
  #ids = new Set<string>();
  #nextId = 0;
  #returnKeys = new Set<string>();
  #filePaths = new Set<string>();

  /** A shallow copy of the instruction list, in order. */
  get instructions(): Instruction[] {
    return [...this.#instructions];
  }

  /** The blobs the program holds (SHA-256 → bytes), in insertion order. */
  get blobs(): ReadonlyMap<string, Uint8Array> {
    return this.#blobs;
  }

  /**
   * The exact `program` part `Client.execute` sends: compact JSON of
   * `{"instructions": […], "options": {…}}` with option keys in upstream's
   * order (`gpu_count`, `timeout_seconds`, `output_limit_bytes`), `options`
   * omitted when empty.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * p.upload({ kind: "module", source: "print(1 + 1)" });
   * const text = p.toJson({ timeoutSeconds: 30 });
   * if (!text.endsWith('"id":"upload_0"}],"options":{"timeout_seconds":30}}')) throw new Error(text);
   * ```
   */
  toJson(options: ExecuteOptions = {}): string {
    const wire = new Map<string, unknown>();
    if (options.gpuCount !== undefined) wire.set("gpu_count", options.gpuCount);
    if (options.timeoutSeconds !== undefined) wire.set("timeout_seconds", options.timeoutSeconds);
    if (options.outputLimitBytes !== undefined) {
      wire.set("output_limit_bytes", options.outputLimitBytes);
    }
    const payload = new Map<string, unknown>([["instructions", this.#instructions]]);
    if (wire.size > 0) payload.set("options", wire);
    return stringifyJson(payload);
  }

  #addId(id: unknown, op: string): string {
    if (id === undefined || id === null) {
      let candidate: string;
      while (this.#ids.has(candidate = `${op}_${this.#nextId}`)) this.#nextId++;
      this.#nextId++;
      this.#ids.add(candidate);
      return candidate;
    }
    if (typeof id !== "string" || id === "") {
      throw new ValidationError("instruction id must be a non-empty string");
    }
    if (this.#ids.has(id)) throw new ValidationError(`duplicate instruction id: ${pyStrRepr(id)}`);
    this.#ids.add(id);
    return id;
  }

  #push(instruction: Record<string, unknown>, blobs: [string, Uint8Array][] = []): void {
    this.#instructions.push(Object.freeze(instruction) as Instruction);
    this.#addBlobs(blobs);
  }

  #addBlobs(blobs: [string, Uint8Array][]): void {
    const added: Uint8Array[] = [];
    for (const [hash, bytes] of blobs) {
      if (this.#blobs.has(hash)) continue;
      this.#blobs.set(hash, bytes);
      // Adopted bytes are scanned for the boundary only if a request carries them.
      if (adoptedDigest(bytes) === hash) noteUnscanned(this, bytes);
      else added.push(bytes);
    }
    if (added.length === 0) return;
    const unscanned = unscannedBlobs(this);
    const all = this.#blobs.values(); // read only if the boundary must be drawn again
    noteBlobs(this, all.filter((bytes) => !unscanned.has(bytes)), added);
  }

  /**
   * Upload Python source (`module`), a tensor, opaque bytes or a library.
   * See {@linkcode UploadOptions} for accepted values.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * p.upload({ kind: "module", source: "import torch" });
   * p.upload({ kind: "tensor", value: new Int32Array([1, 2, 3, 4, 5, 6]), shape: [2, 3] });
   * p.upload({ kind: "tensor", value: new Uint8Array(4), dtype: "bfloat16", shape: [2] });
   * const raw = p.upload({ kind: "bytes", value: new TextEncoder().encode("data") });
   * if (raw.id !== "upload_3" || p.blobs.size !== 3) throw new Error();
   * ```
   */
  upload(options: UploadOptions): Register {
    const { instruction, blob } = encodeUpload(options);
    instruction.id = this.#addId(options.id, "upload");
    this.#push(instruction, blob ? [blob] : []);
    return new Register(instruction.id as string);
  }

  /**
   * Upload bytes as a file in the request workspace; the register holds the
   * normalized relative path. Paths may not clash with other file uploads.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * p.uploadFile({ blob: new TextEncoder().encode("x"), path: "./inputs//a.txt" });
   * if (p.instructions[0].path !== "inputs/a.txt") throw new Error();
   * ```
   */
  uploadFile(options: UploadFileOptions): Register {
    const path = workspacePath(options.path);
    const bytes = bytesLike(options.blob, "file upload requires a bytes-like 'blob'");
    for (const existing of this.#filePaths) {
      if (path === existing) {
        throw new ValidationError(`duplicate file upload path: ${pyStrRepr(path)}`);
      }
      if (path.startsWith(existing + "/") || existing.startsWith(path + "/")) {
        throw new ValidationError(
          `conflicting file upload paths: ${pyStrRepr(existing)} and ${pyStrRepr(path)}`,
        );
      }
    }
    const hash = sha256Hex(bytes);
    const id = this.#addId(options.id, "upload");
    this.#filePaths.add(path);
    this.#push({ op: "upload", id, kind: "file", blob: hash, path }, [[hash, bytes]]);
    return new Register(id);
  }

  /**
   * Upload every regular file under a local directory as file uploads under
   * `path` (`assets/a.bin` with `path: "inputs"` → `inputs/a.bin`), in
   * sorted order, ids assigned in that order. Hidden files are included;
   * empty directories and modes are not sent; symbolic links, special files,
   * a directory seen twice and files changing while read are rejected. An
   * empty folder adds nothing. All or nothing.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const dir = Deno.makeTempDirSync();
   * Deno.writeTextFileSync(`${dir}/a.txt`, "a");
   * const p = new Program();
   * p.uploadFolder(dir, { path: "inputs" });
   * Deno.removeSync(dir, { recursive: true });
   * if (p.instructions[0].path !== "inputs/a.txt") throw new Error();
   * ```
   */
  uploadFolder(folder: string | URL, options: { path: string }): void {
    const destination = workspacePath(options.path);
    const local = folder instanceof URL ? fileURLToPath(folder) : folder;
    const files = folderFiles(local, destination);
    try {
      checkPathConflicts([...this.#filePaths, ...files.map(([remote]) => remote)]);
    } catch (error) {
      if (error instanceof PathError) throw new ValidationError(error.message, { cause: error });
      throw error;
    }
    files.sort(([a], [b]) => comparePy(a, b));
    const blobs: [string, Uint8Array][] = [];
    for (const [remote, bytes] of files) {
      const hash = sha256Hex(bytes);
      blobs.push([hash, bytes]);
      const instruction = { op: "upload", kind: "file", blob: hash, path: remote, id: "" };
      instruction.id = this.#addId(undefined, "upload");
      this.#filePaths.add(remote);
      this.#instructions.push(Object.freeze(instruction) as Instruction);
    }
    this.#addBlobs(blobs);
  }

  #reference(value: unknown, message: string): Ref {
    if (value instanceof Register) return _ref(value.id);
    if (_isRefObject(value)) return _ref(value.$ref);
    throw new TypeError(message);
  }

  /**
   * Select a function (or any name) from an earlier module or library upload.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * const mod = p.upload({ kind: "module", source: "def f():\n    return 1\n" });
   * const f = p.getFunction({ module: mod, name: "f", cpuOnly: true });
   * if (f.id !== "get_function_1" || p.instructions[1].cpu_only !== true) throw new Error();
   * ```
   */
  getFunction(options: GetFunctionOptions): Register {
    const reference = this.#reference(options.module, "module must be a Register or {'$ref': id}");
    if (!this.#ids.has(reference.$ref)) {
      throw new ValidationError(
        `get_function ${pyRepr(options.id ?? null)} references unknown handle ${
          pyStrRepr(reference.$ref)
        }`,
      );
    }
    const { name } = options;
    if (typeof name !== "string" || name === "") {
      throw new ValidationError("function name must be a non-empty string");
    }
    const cpuOnly = options.cpuOnly ?? false;
    if (typeof cpuOnly !== "boolean") throw new TypeError("cpu_only must be a bool");
    const id = this.#addId(options.id, "get_function");
    const instruction: Record<string, unknown> = {
      op: "get_function",
      id,
      module: reference,
      name,
    };
    if (cpuOnly) instruction.cpu_only = true;
    this.#push(instruction);
    return new Register(id);
  }

  /**
   * Call a function. Its result is bound to the returned register and is not
   * sent back unless returned. Top-level register arguments must come from
   * earlier instructions (upstream only checks this on the server).
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * const mod = p.upload({ kind: "module", source: "def scale(x, f):\n    return x * f\n" });
   * const scale = p.getFunction({ module: mod, name: "scale" });
   * const y = p.run({ fn: scale, args: [3, 2] });
   * p.return_({ key: "output", value: y });
   * ```
   */
  run(options: RunOptions): Register {
    const { fn } = options;
    if (!(fn instanceof Register)) throw new TypeError("fn must be a Register");
    const label = pyRepr(options.id ?? null);
    if (!this.#ids.has(fn.id)) {
      throw new ValidationError(`run ${label} references unknown handle ${pyStrRepr(fn.id)}`);
    }
    const rawArgs = options.args ?? [];
    if (!Array.isArray(rawArgs)) throw new TypeError("run args must be an array");
    const args = rawArgs.map((argument) => {
      if (argument instanceof Register) {
        if (!this.#ids.has(argument.id)) {
          throw new ValidationError(
            `run ${label} references unknown handle ${pyStrRepr(argument.id)}`,
          );
        }
        return _ref(argument.id);
      }
      return jsonLiteral(argument);
    });
    const id = this.#addId(options.id, "run");
    this.#push({ op: "run", id, fn: _ref(fn.id), args: Object.freeze(args) });
    return new Register(id);
  }

  #checkReturnKey(key: unknown): asserts key is string {
    if (typeof key !== "string" || key === "") {
      throw new ValidationError("return key must be a non-empty string");
    }
    if (this.#returnKeys.has(key)) {
      throw new ValidationError(`duplicate return key: ${pyStrRepr(key)}`);
    }
  }

  /**
   * Send an earlier value back under `key` (kept even if a later instruction fails).
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * const bytes = p.upload({ kind: "bytes", value: new Uint8Array([1]) });
   * p.return_({ key: "echo", value: bytes });
   * ```
   */
  return_(options: ReturnOptions): void {
    const { key } = options;
    this.#checkReturnKey(key);
    const reference = this.#reference(
      options.value,
      "return value must be a Register or {'$ref': id}",
    );
    if (!this.#ids.has(reference.$ref)) {
      throw new ValidationError(
        `return ${pyStrRepr(key)} references unknown handle ${pyStrRepr(reference.$ref)}`,
      );
    }
    this.#returnKeys.add(key);
    this.#push({ op: "return", key, value: reference });
  }

  #returnPath(options: ReturnPathOptions, kind: "file" | "folder"): void {
    const { key, path } = options;
    this.#checkReturnKey(key);
    let wirePath: string | Ref;
    if (path instanceof Register) {
      if (!this.#ids.has(path.id)) {
        throw new ValidationError(
          `return ${pyStrRepr(key)} references unknown handle ${pyStrRepr(path.id)}`,
        );
      }
      wirePath = _ref(path.id);
    } else {
      wirePath = workspacePath(path);
    }
    this.#returnKeys.add(key);
    this.#push({ op: "return", key, kind, path: wirePath });
  }

  /**
   * Send back a regular file of the request workspace, as it is at this point.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * p.returnFile({ key: "report", path: "outputs/report.txt" });
   * ```
   */
  returnFile(options: ReturnPathOptions): void {
    this.#returnPath(options, "file");
  }

  /**
   * Send back a whole folder of the request workspace (hidden files and
   * empty directories included), as it is at this point.
   *
   * @example
   * ```ts
   * import { Program } from "./mod.ts";
   *
   * const p = new Program();
   * p.returnFolder({ key: "debug", path: "outputs/debug" });
   * ```
   */
  returnFolder(options: ReturnPathOptions): void {
    this.#returnPath(options, "folder");
  }
}
