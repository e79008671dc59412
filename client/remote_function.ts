/**
 * Remote functions from Python source text: the TS analogue of upstream's
 * `Client.function` decorator, with its wire convention (spec protocol §5.7).
 *
 * @module
 */

import { pyStrRepr } from "../protocol/python_repr.ts";
import { ProtocolError, ValidationError } from "./errors.ts";
import { Program } from "./program.ts";
import type { ExecuteOptions } from "./program_options.ts";
import { jsonLiteral } from "./_json_literal.ts";
import type { ProgramResult, ResultValue } from "./result.ts";
import type { Register } from "./register.ts";
import { Tensor } from "./tensor.ts";

/**
 * What {@linkcode RemoteFunction} needs to execute programs (a {@linkcode Client}).
 *
 * @example
 * ```ts
 * import { type ProgramExecutor, ProgramResult, RemoteFunction } from "./mod.ts";
 *
 * // A stand-in executor (e.g. for tests) instead of a Client.
 * const executor: ProgramExecutor = {
 *   execute: () => Promise.resolve(new ProgramResult({
 *     status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 0, leaseWaitMs: 0, leaseHeldMs: 0,
 *     results: new Map([["output", 3]]), stdout: "", stderr: "", stdoutTruncated: false,
 *     stderrTruncated: false, error: null, gpuIds: [],
 *   })),
 * };
 * const add = new RemoteFunction(executor, { source: "def add(a, b):\n    return a + b\n", name: "add" });
 * if ((await add.remote([1, 2])) !== 3) throw new Error();
 * ```
 */
export interface ProgramExecutor {
  /** Run a program (see `Client.execute`). */
  execute(program: Program, options?: ExecuteOptions): Promise<ProgramResult>;
}

/**
 * Options of {@linkcode RemoteFunction} (and `Client.pythonFunction`).
 *
 * @example
 * ```ts
 * import { Client, type RemoteFunctionOptions } from "./mod.ts";
 *
 * const options: RemoteFunctionOptions = {
 *   source: "import torch\n\ndef ones(n):\n    return torch.ones(n, device='cuda').sum().item()\n",
 *   name: "ones",
 *   timeoutSeconds: 60,
 * };
 * await using client = new Client("http://127.0.0.1:8000");
 * const ones = client.pythonFunction(options);
 * ```
 */
export interface RemoteFunctionOptions {
  /**
   * Python source defining the function (and anything it needs: imports,
   * helpers). It is uploaded as one module; its top-level code runs on the
   * server before each call.
   */
  source: string;
  /** The function's name in `source` (an ASCII Python identifier). */
  name: string;
  /** Server execution limit in seconds. */
  timeoutSeconds?: number;
  /** Captured output limit per stream. */
  outputLimitBytes?: number;
  /** The function touches no GPU (its run releases the GPU lease). */
  cpuOnly?: boolean;
}

/**
 * A remote function's program FAILED. `result` keeps the request id, error,
 * traceback and captured output.
 *
 * @example
 * ```ts
 * import { RemoteExecutionError } from "./mod.ts";
 *
 * if (!(RemoteExecutionError.prototype instanceof Error)) throw new Error();
 * ```
 */
export class RemoteExecutionError extends Error {
  /** The failed outcome. */
  readonly result: ProgramResult;

  /** Create the error: `Remote execution <request_id> failed: <kind>: <message>`. */
  constructor(result: ProgramResult) {
    const kind = result.error?.kind ?? "unknown";
    const message = result.error?.message ?? "no error details";
    super(`Remote execution ${result.requestId} failed: ${kind}: ${message}`);
    this.name = "RemoteExecutionError";
    this.result = result;
  }
}

const _PYTHON_KEYWORDS = new Set(
  ("False None True and as assert async await break class continue def del elif else except " +
    "finally for from global if import in is lambda nonlocal not or pass raise return try " +
    "while with yield").split(" "),
);

/** The wrapper upstream appends: unwraps literals, then calls `name(*args, **kwargs)`. */
function _wrapperSource(name: string): string {
  return `
def _kcoral_invoke_${name}(nargs, names, literals, *values):
    import builtins as _kcoral_builtins
    values = [value["value"] if literal else value
              for literal, value in _kcoral_builtins.zip(literals, values)]
    return _kcoral_builtins.globals()[${pyStrRepr(name)}](
        *values[:nargs], **_kcoral_builtins.dict(_kcoral_builtins.zip(names, values[nargs:]))
    )
`;
}

/**
 * A Python function, given as source text, called remotely with upstream's
 * wire convention: `upload` id `module` (the source plus a generated wrapper
 * `_kcoral_invoke_<name>`), `get_function` id `function`, argument `i` as
 * `upload` id `arg_<i>` (kind `bytes` for `Uint8Array`/`Uint8ClampedArray`/
 * `ArrayBuffer`/`DataView`, kind `tensor` for other typed arrays and {@linkcode Tensor}s)
 * or a JSON literal wrapped as `{"value": …}`, `run` id `output` with args
 * `[nargs, [keyword names], [literal flags], …values]`, `return_` key
 * `output`. Positional arguments come first, then keyword values. Defaults
 * are applied by Python on the server.
 *
 * @example
 * ```ts
 * import { Client, RemoteFunction } from "./mod.ts";
 *
 * await using client = new Client("http://127.0.0.1:8000");
 * const norm = new RemoteFunction(client, {
 *   source: "import math\n\ndef norm(xs):\n    return math.sqrt(sum(x * x for x in xs))\n",
 *   name: "norm",
 *   cpuOnly: true,
 * });
 * const program = norm.buildProgram([[3, 4]]);
 * if (program.instructions[2].id !== "output") throw new Error();
 * ```
 */
export class RemoteFunction {
  /** The Python function name. */
  readonly name: string;
  /** The module source uploaded (the given source plus the wrapper). */
  readonly source: string;
  /** `_kcoral_invoke_<name>`, the function the program selects. */
  readonly entry: string;
  readonly #client: ProgramExecutor;
  readonly #options: ExecuteOptions;
  readonly #cpuOnly: boolean;

  /** Bind Python source to a client; nothing is contacted. */
  constructor(client: ProgramExecutor, options: RemoteFunctionOptions) {
    const { source, name } = options;
    if (typeof source !== "string") throw new TypeError("remote function source must be a string");
    if (typeof name !== "string" || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      throw new ValidationError("remote function name must be an ASCII Python identifier");
    }
    if (_PYTHON_KEYWORDS.has(name)) {
      throw new ValidationError(`remote function name is a Python keyword: ${name}`);
    }
    const cpuOnly = options.cpuOnly ?? false;
    if (typeof cpuOnly !== "boolean") throw new TypeError("cpu_only must be a bool");
    this.name = name;
    this.entry = `_kcoral_invoke_${name}`;
    this.source = (source === "" || source.endsWith("\n") ? source : source + "\n") +
      _wrapperSource(name);
    this.#client = client;
    this.#cpuOnly = cpuOnly;
    this.#options = {};
    if (options.timeoutSeconds !== undefined) this.#options.timeoutSeconds = options.timeoutSeconds;
    if (options.outputLimitBytes !== undefined) {
      this.#options.outputLimitBytes = options.outputLimitBytes;
    }
  }

  /**
   * Build the program for one call without contacting the server.
   *
   * @param args positional arguments.
   * @param kwargs keyword arguments (a `Map` or a plain object; order kept).
   */
  buildProgram(
    args: readonly unknown[] = [],
    kwargs: Readonly<Record<string, unknown>> | ReadonlyMap<string, unknown> = {},
  ): Program {
    if (!Array.isArray(args)) throw new TypeError("remote function args must be an array");
    const keywords: [string, unknown][] = kwargs instanceof Map
      ? [...kwargs]
      : Object.entries(kwargs);
    for (const [key] of keywords) {
      if (typeof key !== "string") throw new TypeError("keyword argument names must be strings");
    }
    const program = new Program();
    const module = program.upload({ id: "module", kind: "module", source: this.source });
    const fn = program.getFunction({
      id: "function",
      module,
      name: this.entry,
      cpuOnly: this.#cpuOnly,
    });
    const values: (Register | Map<string, unknown>)[] = [];
    const literals: boolean[] = [];
    [...args, ...keywords.map(([, value]) => value)].forEach((value, i) => {
      if (
        value instanceof Uint8Array || value instanceof Uint8ClampedArray ||
        value instanceof ArrayBuffer || value instanceof DataView
      ) {
        values.push(program.upload({ id: `arg_${i}`, kind: "bytes", value }));
        literals.push(false);
      } else if (value instanceof Tensor || ArrayBuffer.isView(value)) {
        values.push(program.upload({ id: `arg_${i}`, kind: "tensor", value }));
        literals.push(false);
      } else {
        // Wrapping prevents a literal {"$ref": …} from being read as a handle.
        values.push(new Map([["value", jsonLiteral(value)]]));
        literals.push(true);
      }
    });
    const output = program.run({
      id: "output",
      fn,
      args: [args.length, keywords.map(([key]) => key), literals, ...values],
    });
    program.return_({ key: "output", value: output });
    return program;
  }

  /** Run remotely; the full {@linkcode ProgramResult} (failures are data). */
  execute(
    args: readonly unknown[] = [],
    kwargs: Readonly<Record<string, unknown>> | ReadonlyMap<string, unknown> = {},
  ): Promise<ProgramResult> {
    return this.#client.execute(this.buildProgram(args, kwargs), { ...this.#options });
  }

  /**
   * Run remotely and return the decoded value.
   *
   * @throws {RemoteExecutionError} when the program FAILED.
   * @throws {ProtocolError} when the response has no `output`.
   */
  async remote<T extends ResultValue = ResultValue>(
    args: readonly unknown[] = [],
    kwargs: Readonly<Record<string, unknown>> | ReadonlyMap<string, unknown> = {},
  ): Promise<T> {
    const result = await this.execute(args, kwargs);
    if (!result.completed) throw new RemoteExecutionError(result);
    if (!result.has("output")) {
      throw new ProtocolError("remote function response is missing its output");
    }
    return result.get<T>("output");
  }
}
