/**
 * The types of the program builder's arguments and instructions (spec protocol §5.2): what
 * {@linkcode Program}'s methods take, and the execution options `Client.execute` sends.
 *
 * @module
 */

import type { OutputChunk } from "../protocol/live_output.ts";
import type { Register } from "./register.ts";

/**
 * A wire reference, `{"$ref": id}`.
 *
 * @example
 * ```ts
 * import { Program, type Ref } from "./mod.ts";
 *
 * const p = new Program();
 * p.upload({ kind: "module", source: "", id: "m" });
 * const module: Ref = { $ref: "m" };
 * p.getFunction({ module, name: "f" });
 * ```
 */
export type Ref = { readonly $ref: string };

/**
 * One wire instruction as it will be serialized (keys in wire order). Frozen:
 * use the builder methods to add instructions.
 *
 * @example
 * ```ts
 * import { type Instruction, Program } from "./mod.ts";
 *
 * const p = new Program();
 * p.upload({ kind: "module", source: "x = 1" });
 * const first: Instruction = p.instructions[0];
 * if (first.op !== "upload" || first.kind !== "module") throw new Error();
 * ```
 */
export type Instruction = {
  /** `upload`, `get_function`, `run` or `return`. */
  readonly op: "upload" | "get_function" | "run" | "return";
  /** The other fields of the instruction (see spec §2.4). */
  readonly [field: string]: unknown;
};

/**
 * Upload kinds accepted by {@linkcode Program.upload}.
 *
 * @example
 * ```ts
 * import { Program, type UploadKind } from "./mod.ts";
 *
 * const kind: UploadKind = "bytes";
 * new Program().upload({ kind, value: new Uint8Array([1]) });
 * ```
 */
export type UploadKind = "module" | "tensor" | "bytes" | "library";

/**
 * Arguments of {@linkcode Program.upload}.
 *
 * @example
 * ```ts
 * import { Program, type UploadOptions } from "./mod.ts";
 *
 * const options: UploadOptions = { kind: "tensor", value: new Float32Array(6), shape: [2, 3], id: "x" };
 * new Program().upload(options);
 * ```
 */
export interface UploadOptions {
  /** `module` (Python source), `tensor`, `bytes` or `library` (a TVM FFI shared library). */
  kind: UploadKind;
  /** Python source text (`module` only). */
  source?: string;
  /**
   * For `tensor`:
   * - `Float32Array` → float32, `Float64Array` → float64, `Int8Array` → int8,
   *   `Int16Array` → int16, `Int32Array` → int32, `BigInt64Array` → int64,
   *   `Float16Array` → float16; `shape` defaults to `[length]` and may be any
   *   shape with as many elements; a given `dtype` must match;
   * - a {@linkcode Tensor} or any `{dtype, shape, data}` (the way to send
   *   bool, uint8, bfloat16 and float8): a given `dtype`/`shape` must match;
   * - raw bytes (`Uint8Array`, `Uint8ClampedArray`, `ArrayBuffer`,
   *   `DataView`): `dtype` and `shape` are both required, as upstream requires
   *   for raw bytes (so a `Uint8Array` is never guessed to be uint8).
   *
   * Other typed arrays (`Uint16Array`, `Uint32Array`, `BigUint64Array`) have
   * no wire dtype and are a `TypeError`.
   *
   * For `bytes`/`library`: `Uint8Array`, any `ArrayBufferView` or an
   * `ArrayBuffer`. Values are copied now: later changes do not affect the program.
   *
   * For `tensor`, `bytes` and `library`: a {@linkcode KeptReturn}, a value the server kept from
   * an earlier program, named by its digest and sent as no bytes.
   */
  value?: unknown;
  /** Tensor element type (required for raw bytes; must match otherwise). */
  dtype?: string;
  /** Tensor dimensions (required for raw bytes; a typed array may be reshaped). */
  shape?: readonly number[];
  /** Instruction id; `upload_<n>` when omitted. */
  id?: string;
}

/**
 * Arguments of {@linkcode Program.uploadFile}.
 *
 * @example
 * ```ts
 * import { Program, type UploadFileOptions } from "./mod.ts";
 *
 * const options: UploadFileOptions = { blob: new TextEncoder().encode("a,b\n"), path: "data/in.csv" };
 * new Program().uploadFile(options);
 * ```
 */
export interface UploadFileOptions {
  /** The file contents (copied now). */
  blob: ArrayBuffer | ArrayBufferView;
  /** Destination relative to the request's working directory. */
  path: string;
  /** Instruction id; `upload_<n>` when omitted. */
  id?: string;
}

/**
 * Arguments of {@linkcode Program.getFunction}.
 *
 * @example
 * ```ts
 * import { type GetFunctionOptions, Program } from "./mod.ts";
 *
 * const p = new Program();
 * const module = p.upload({ kind: "module", source: "def f():\n    pass\n" });
 * const options: GetFunctionOptions = { module, name: "f", cpuOnly: true };
 * p.getFunction(options);
 * ```
 */
export interface GetFunctionOptions {
  /** An earlier module or library upload. */
  module: Register | Ref;
  /** The function's name in it. */
  name: string;
  /** The function promises not to touch the GPU (its runs release the lease). */
  cpuOnly?: boolean;
  /** Instruction id; `get_function_<n>` when omitted. */
  id?: string;
}

/**
 * Arguments of {@linkcode Program.run}.
 *
 * @example
 * ```ts
 * import { Program, type RunOptions } from "./mod.ts";
 *
 * const p = new Program();
 * const fn = p.getFunction({ module: p.upload({ kind: "module", source: "f = print" }), name: "f" });
 * const options: RunOptions = { fn, args: [1, { nested: [true] }], id: "call" };
 * p.run(options);
 * ```
 */
export interface RunOptions {
  /** The function (a register from `getFunction`, or a callable returned by `run`). */
  fn: Register;
  /**
   * Positional arguments: top-level registers become references; anything
   * else is a JSON literal (copied now), where `Map`s keep their key order.
   */
  args?: readonly unknown[];
  /** Instruction id; `run_<n>` when omitted. */
  id?: string;
}

/**
 * Arguments of {@linkcode Program.return_}.
 *
 * @example
 * ```ts
 * import { Program, type ReturnOptions } from "./mod.ts";
 *
 * const p = new Program();
 * const options: ReturnOptions = { key: "raw", value: p.upload({ kind: "bytes", value: new Uint8Array(1) }) };
 * p.return_(options);
 * ```
 */
export interface ReturnOptions {
  /** Unique key in `ProgramResult.results`. */
  key: string;
  /** The value to return. */
  value: Register | Ref;
}

/**
 * Arguments of {@linkcode Program.returnFile} and {@linkcode Program.returnFolder}.
 *
 * @example
 * ```ts
 * import { Program, type ReturnPathOptions } from "./mod.ts";
 *
 * const options: ReturnPathOptions = { key: "report", path: "out/report.txt" };
 * new Program().returnFile(options);
 * ```
 */
export interface ReturnPathOptions {
  /** Unique key in `ProgramResult.results`. */
  key: string;
  /** Path relative to the request workspace, or a register holding one. */
  path: string | Register;
}

/**
 * Options for one execution; `Program.toJson` puts them in `options`.
 *
 * @example
 * ```ts
 * import { type ExecuteOptions, Program } from "./mod.ts";
 *
 * const options: ExecuteOptions = { timeoutSeconds: 120, outputLimitBytes: 65536, gpuCount: 2 };
 * const p = new Program();
 * p.upload({ kind: "module", source: "" });
 * if (!p.toJson(options).includes('"gpu_count":2')) throw new Error();
 * ```
 */
export interface ExecuteOptions {
  /** Server-side execution limit (clamped by the server). */
  timeoutSeconds?: number;
  /** Captured output limit per stream (clamped by the server; 0 disables capture). */
  outputLimitBytes?: number;
  /** Run once on 1–8 GPUs of one server. */
  gpuCount?: number;
  /**
   * Abandons the call when aborted (e.g. `AbortSignal.timeout(ms)`; the protocol itself has no
   * response timeout): its connection is closed and the call rejects with the signal's reason.
   * Whether the program ran is then unknown. Not sent to the server.
   */
  signal?: AbortSignal;
  /**
   * Called as the request goes out and the answer comes in (e.g. to show a progress line for
   * large uploads and results). Reported on plain `http://` servers, where the client writes
   * and reads the bytes itself; over `fetch` (`https://`, proxies) it is not called. Not sent
   * to the server.
   */
  onProgress?: (progress: TransferProgress) => void;
  /**
   * Asks for live output (`X-KCoral-Stream: output`, docs/live-output.md): called with each
   * piece of the program's stdout or stderr while it runs, in order. The pieces of a stream,
   * joined, are a prefix of the result's `stdout`/`stderr` (all of it unless the result is
   * cut by the output limit's decoding at its very end: compare before printing the rest). A
   * server that does not stream (upstream) never calls it: the result is the same either way.
   * Not sent to the server.
   *
   * @example
   * ```ts
   * import type { ExecuteOptions, OutputChunk } from "./mod.ts";
   *
   * const seen: OutputChunk[] = [];
   * const options: ExecuteOptions = { onOutput: (chunk) => seen.push(chunk) };
   * options.onOutput?.({ stream: "stdout", data: "step 1\n" });
   * if (seen.length !== 1) throw new Error();
   * ```
   */
  onOutput?: (chunk: OutputChunk) => void;
  /**
   * Asks the server to keep returned `bytes` and tensors of at least this many bytes in its blob
   * cache instead of sending them (`X-KCoral-Keep-Returns`, docs/kept-returns.md): they come
   * back as {@linkcode KeptReturn}s, which a later program uploads by reference without sending
   * bytes. A server that does not keep returns (upstream) sends them as usual. Not in the
   * program.
   *
   * @example
   * ```ts
   * import type { ExecuteOptions } from "./mod.ts";
   *
   * const options: ExecuteOptions = { keepReturns: 1 << 20 }; // keep returns of 1 MiB and more
   * if (options.keepReturns !== 1048576) throw new Error();
   * ```
   */
  keepReturns?: number;
  /**
   * Through a Router: the node to run on when it can (`X-KCoral-Node`), e.g. the
   * {@linkcode ProgramResult.node} that kept a program's returns. Not in the program.
   */
  node?: string;
}

/**
 * How far a request's upload or its answer's download has come.
 *
 * @example
 * ```ts
 * import type { TransferProgress } from "./program_options.ts";
 *
 * const shown: string[] = [];
 * const onProgress = (p: TransferProgress) =>
 *   shown.push(`${p.direction} ${Math.round((100 * p.bytes) / p.total)}%`);
 * onProgress({ direction: "upload", bytes: 512, total: 1024 });
 * if (shown[0] !== "upload 50%") throw new Error();
 * ```
 */
export interface TransferProgress {
  /** `"upload"`: the request going out; `"download"`: the answer coming in. */
  direction: "upload" | "download";
  /** Bytes so far. */
  bytes: number;
  /** All the bytes of this request or answer. */
  total: number;
}
