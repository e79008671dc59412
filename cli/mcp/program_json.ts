/**
 * `run_program`'s instructions: a KCoral program written as JSON, close to the wire format
 * (spec protocol §2.4) but with the data inline, turned into a {@linkcode Program} by the
 * builder's own methods (so every check and message is the builder's).
 *
 * | `op`           | fields                                                                        |
 * | -------------- | ----------------------------------------------------------------------------- |
 * | `upload`       | `kind` `module` + `source`; `tensor` + `dtype`, `shape`, `data` (numbers) or `base64`; `bytes`/`library` + `text`, `base64` or `local_path`; `file` + `path` and one of those |
 * | `get_function` | `module: {"$ref": id}`, `name`, `cpu_only`                                     |
 * | `run`          | `fn: {"$ref": id}`, `args` (`{"$ref": id}` at top level, `{"$float": 2}` for a float) |
 * | `return`       | `key` and `value: {"$ref": id}`, or `key`, `kind` `file`/`folder` and `path`   |
 *
 * Every instruction may carry an `id`.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { z } from "zod";
import { JsonFloat } from "../../protocol/json_float.ts";
import { Program, Register } from "../../client/mod.ts";
import { ToolFailure } from "./call.ts";

const _ref = z.object({ $ref: z.string().min(1) }).strict();

/** One JSON instruction. */
export const instructionSchema = z.discriminatedUnion("op", [
  z.object({
    op: z.literal("upload"),
    kind: z.enum(["module", "tensor", "bytes", "library", "file"]),
    id: z.string().min(1).optional(),
    source: z.string().optional().describe("module: Python source"),
    dtype: z.string().optional().describe("tensor: float32, int64, bfloat16, ..."),
    shape: z.array(z.number().int().nonnegative()).optional().describe("tensor: dimensions"),
    data: z.array(z.union([z.number(), z.boolean()])).optional().describe(
      "tensor: the elements, row-major",
    ),
    text: z.string().optional().describe("bytes/library/file: UTF-8 contents"),
    base64: z.string().optional().describe("tensor/bytes/library/file: contents, base64"),
    local_path: z.string().optional().describe(
      "bytes/library/file: read from this local file (relative to where kcoral mcp runs)",
    ),
    path: z.string().optional().describe("file: destination in the request's working directory"),
  }).strict(),
  z.object({
    op: z.literal("get_function"),
    id: z.string().min(1).optional(),
    module: _ref,
    name: z.string().min(1),
    cpu_only: z.boolean().optional(),
  }).strict(),
  z.object({
    op: z.literal("run"),
    id: z.string().min(1).optional(),
    fn: _ref,
    args: z.array(z.unknown()).optional(),
  }).strict(),
  z.object({
    op: z.literal("return"),
    key: z.string().min(1),
    value: _ref.optional(),
    kind: z.enum(["file", "folder"]).optional(),
    path: z.string().optional(),
  }).strict(),
]);

/** One parsed JSON instruction. */
export type JsonInstruction = z.infer<typeof instructionSchema>;

/**
 * Build the program of `instructions`; local paths are relative to `cwd`, and each is given to
 * `checkPath` before it is read (`kcoral mcp` refuses paths outside the directories it may send
 * from: cli/mcp/local_files.ts).
 *
 * @throws {ToolFailure} kind `invalid_input`: `instruction N (op): why`.
 *
 * @example
 * ```ts
 * import { buildJsonProgram } from "./program_json.ts";
 *
 * const program = await buildJsonProgram([
 *   { op: "upload", kind: "module", id: "m", source: "def f(x):\n    return x * 2\n" },
 *   { op: "get_function", id: "f", module: { $ref: "m" }, name: "f" },
 *   { op: "run", id: "y", fn: { $ref: "f" }, args: [{ $float: 2 }] },
 *   { op: "return", key: "y", value: { $ref: "y" } },
 * ], Deno.cwd());
 * if (!program.toJson().includes('"args":[2.0]')) throw new Error(program.toJson());
 * ```
 */
export async function buildJsonProgram(
  instructions: readonly JsonInstruction[],
  cwd: string,
  checkPath: (path: string) => Promise<void> = () => Promise.resolve(),
): Promise<Program> {
  const program = new Program();
  for (const [index, instruction] of instructions.entries()) {
    try {
      if (instruction.op === "upload" && typeof instruction.local_path === "string") {
        await checkPath(instruction.local_path);
      }
      await _add(program, instruction, cwd);
    } catch (error) {
      const why = error instanceof ToolFailure ? error.message : (error as Error).message;
      throw new ToolFailure("invalid_input", `instruction ${index} (${instruction.op}): ${why}`);
    }
  }
  return program;
}

async function _add(program: Program, item: JsonInstruction, cwd: string): Promise<void> {
  if (item.op === "get_function") {
    program.getFunction({
      module: item.module,
      name: item.name,
      ...(item.cpu_only === undefined ? {} : { cpuOnly: item.cpu_only }),
      ...(item.id === undefined ? {} : { id: item.id }),
    });
  } else if (item.op === "run") {
    program.run({
      fn: new Register(item.fn.$ref),
      args: (item.args ?? []).map(_topLevelArgument),
      ...(item.id === undefined ? {} : { id: item.id }),
    });
  } else if (item.op === "return") {
    if (item.value !== undefined) {
      if (item.kind !== undefined || item.path !== undefined) {
        throw new ToolFailure("invalid_input", "give value, or kind and path, not both");
      }
      program.return_({ key: item.key, value: item.value });
    } else if (item.kind !== undefined && item.path !== undefined) {
      if (item.kind === "file") program.returnFile({ key: item.key, path: item.path });
      else program.returnFolder({ key: item.key, path: item.path });
    } else {
      throw new ToolFailure("invalid_input", 'give value {"$ref": id}, or kind and path');
    }
  } else {
    await _upload(program, item, cwd);
  }
}

type _Upload = Extract<JsonInstruction, { op: "upload" }>;

async function _upload(program: Program, item: _Upload, cwd: string): Promise<void> {
  const id = item.id === undefined ? {} : { id: item.id };
  const allowed: Record<_Upload["kind"], string[]> = {
    module: ["source"],
    tensor: ["dtype", "shape", "data", "base64"],
    bytes: ["text", "base64", "local_path"],
    library: ["text", "base64", "local_path"],
    file: ["path", "text", "base64", "local_path"],
  };
  const extra = ["source", "dtype", "shape", "data", "text", "base64", "local_path", "path"]
    .filter((field) =>
      item[field as keyof _Upload] !== undefined && !allowed[item.kind].includes(field)
    );
  if (extra.length > 0) {
    throw new ToolFailure("invalid_input", `kind ${item.kind} does not take ${extra.join(", ")}`);
  }
  if (item.kind === "module") {
    if (item.source === undefined) throw new ToolFailure("invalid_input", "module needs source");
    program.upload({ kind: "module", source: item.source, ...id });
    return;
  }
  if (item.kind === "tensor") {
    if (item.dtype === undefined || item.shape === undefined) {
      throw new ToolFailure("invalid_input", "tensor needs dtype and shape");
    }
    const value = _tensorData(item);
    program.upload({ kind: "tensor", value, dtype: item.dtype, shape: item.shape, ...id });
    return;
  }
  const bytes = await _contents(item, cwd);
  if (item.kind === "file") {
    if (item.path === undefined) throw new ToolFailure("invalid_input", "file needs path");
    program.uploadFile({ blob: bytes, path: item.path, ...id });
  } else {
    program.upload({ kind: item.kind, value: bytes, ...id });
  }
}

const _TYPED: Record<string, (values: number[]) => ArrayBufferView> = {
  float32: (v) => new Float32Array(v),
  float64: (v) => new Float64Array(v),
  int8: (v) => new Int8Array(v),
  int16: (v) => new Int16Array(v),
  int32: (v) => new Int32Array(v),
  int64: (v) => new BigInt64Array(v.map((x) => BigInt(x))),
  uint8: (v) => new Uint8Array(v),
  bool: (v) => new Uint8Array(v),
};

function _tensorData(item: _Upload): Uint8Array {
  if ((item.data === undefined) === (item.base64 === undefined)) {
    throw new ToolFailure("invalid_input", "tensor needs exactly one of data or base64");
  }
  if (item.base64 !== undefined) return _base64(item.base64);
  const make = _TYPED[item.dtype!];
  if (make === undefined) {
    throw new ToolFailure(
      "invalid_input",
      `data lists are accepted for ${Object.keys(_TYPED).join(", ")}; send ${item.dtype} as base64`,
    );
  }
  const values = item.data!.map((v) => (typeof v === "boolean" ? Number(v) : v));
  if (item.dtype !== "float32" && item.dtype !== "float64" && !values.every(Number.isInteger)) {
    throw new ToolFailure("invalid_input", `${item.dtype} data must be integers`);
  }
  const view = make(values);
  return new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
}

async function _contents(item: _Upload, cwd: string): Promise<Uint8Array> {
  const given = [item.text, item.base64, item.local_path].filter((v) => v !== undefined).length;
  if (given !== 1) {
    throw new ToolFailure(
      "invalid_input",
      `${item.kind} needs exactly one of text, base64 or local_path`,
    );
  }
  if (item.text !== undefined) return new TextEncoder().encode(item.text);
  if (item.base64 !== undefined) return _base64(item.base64);
  const path = item.local_path!.startsWith("/") ? item.local_path! : `${cwd}/${item.local_path}`;
  try {
    return await Deno.readFile(path);
  } catch (error) {
    throw new ToolFailure(
      "invalid_input",
      `cannot read local_path ${item.local_path}: ${(error as Error).message}`,
    );
  }
}

function _base64(text: string): Uint8Array {
  const compact = text.replace(/\s+/g, "");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(compact) || compact.length % 4 !== 0) {
    throw new ToolFailure("invalid_input", "base64 is not valid base64");
  }
  return new Uint8Array(Buffer.from(compact, "base64"));
}

// Top-level {"$ref": id} → a register; {"$float": x} anywhere → a JSON float.
function _topLevelArgument(value: unknown): unknown {
  if (_isRef(value)) return new Register(value.$ref);
  return _floats(value);
}

function _floats(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(_floats);
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value);
    if (entries.length === 1 && entries[0][0] === "$float" && typeof entries[0][1] === "number") {
      return new JsonFloat(entries[0][1]);
    }
    return Object.fromEntries(entries.map(([key, item]) => [key, _floats(item)]));
  }
  return value;
}

function _isRef(value: unknown): value is { $ref: string } {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    Object.keys(value).length === 1 && typeof (value as { $ref?: unknown }).$ref === "string";
}
