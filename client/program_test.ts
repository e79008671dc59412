import assert from "node:assert/strict";
import { JsonFloat, Program, Register, Tensor, ValidationError } from "../mod.ts";
import { sha256Hex } from "../protocol/mod.ts";

const SPEC_PROGRAM =
  '{"instructions":[{"op":"upload","kind":"module","source":"def add_one(x):\\n    return x + 1\\n","id":"upload_0"},{"op":"get_function","id":"get_function_1","module":{"$ref":"upload_0"},"name":"add_one"},{"op":"upload","kind":"tensor","blob":"ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1","dtype":"float32","shape":[4],"id":"upload_2"},{"op":"run","id":"run_3","fn":{"$ref":"get_function_1"},"args":[{"$ref":"upload_2"}]},{"op":"return","key":"y","value":{"$ref":"run_3"}}],"options":{"timeout_seconds":30}}';

/** State that must not change when a builder call fails. */
function snapshot(p: Program): string {
  return p.toJson() + "|" + [...p.blobs.keys()].join(",");
}

/** Assert that `fn` throws `type` (with `message` when given) and leaves `p` unchanged. */
function unchanged(
  p: Program,
  fn: () => unknown,
  type: ErrorConstructor | typeof ValidationError,
  message?: string,
): void {
  const before = snapshot(p);
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof type, `${error}`);
    if (message !== undefined) assert.equal((error as Error).message, message);
    return true;
  });
  assert.equal(snapshot(p), before);
}

Deno.test("program: the spec §10 program JSON and SHA-256, exactly", () => {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "def add_one(x):\n    return x + 1\n" });
  const fn = p.getFunction({ module: mod, name: "add_one" });
  const x = p.upload({ kind: "tensor", value: new Float32Array([1, 2, 3, 4]), shape: [4] });
  const y = p.run({ fn, args: [x] });
  p.return_({ key: "y", value: y });
  assert.deepEqual([mod.id, fn.id, x.id, y.id], [
    "upload_0",
    "get_function_1",
    "upload_2",
    "run_3",
  ]);
  assert.equal(p.toJson({ timeoutSeconds: 30 }), SPEC_PROGRAM);
  const hash = "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1";
  assert.deepEqual([...p.blobs.keys()], [hash]);
  assert.deepEqual(
    p.blobs.get(hash),
    new Uint8Array([0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40]),
  );
  assert.equal(sha256Hex(p.blobs.get(hash)!), hash);
});

Deno.test("program: automatic ids share one counter and skip taken ids", () => {
  const p = new Program();
  p.upload({ kind: "module", source: "", id: "upload_0" });
  const a = p.upload({ kind: "module", source: "" }); // upload_0 taken -> upload_1
  const g = p.getFunction({ module: a, name: "f" }); // counter 2
  const r = p.run({ fn: g, id: "run_3" }); // explicit: counter stays at 3
  const b = p.upload({ kind: "bytes", value: new Uint8Array([1]) }); // upload_3
  const r2 = p.run({ fn: g }); // run_4
  const c = p.upload({ kind: "module", source: "", id: "custom" });
  const r3 = p.run({ fn: r }); // run_5
  assert.deepEqual([a.id, g.id, r.id, b.id, r2.id, c.id, r3.id], [
    "upload_1",
    "get_function_2",
    "run_3",
    "upload_3",
    "run_4",
    "custom",
    "run_5",
  ]);
  unchanged(
    p,
    () => p.upload({ kind: "module", source: "", id: "custom" }),
    ValidationError,
    "duplicate instruction id: 'custom'",
  );
  unchanged(
    p,
    () => p.upload({ kind: "module", source: "", id: "" }),
    ValidationError,
    "instruction id must be a non-empty string",
  );
  // A failed call does not advance the counter.
  unchanged(
    p,
    () => p.upload({ kind: "tensor", value: new Uint8Array(3), dtype: "int16", shape: [2] }),
    ValidationError,
  );
  assert.equal(p.upload({ kind: "module", source: "" }).id, "upload_6");
});

Deno.test("program: wire shape of every instruction kind (key order as upstream)", () => {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "s" });
  const lib = p.upload({ kind: "library", value: new Uint8Array([0x7f, 0x45]).buffer });
  const fn = p.getFunction({ module: { $ref: mod.id }, name: "f", cpuOnly: true });
  p.getFunction({ module: lib, name: "g", cpuOnly: false, id: "gid" });
  const file = p.uploadFile({ blob: new Uint8Array([1]), path: "in//a.bin", id: "fid" });
  const out = p.run({
    fn,
    args: [file, 1, "x", null, true, 2n ** 70n, new JsonFloat(2), new Map([["b", 1], ["a", 2]]), {
      $ref: "raw",
    }],
  });
  p.return_({ key: "v", value: { $ref: out.id } });
  p.returnFile({ key: "f", path: "./out/r.txt" });
  p.returnFolder({ key: "d", path: file });
  const hex = (bytes: number[]) => sha256Hex(new Uint8Array(bytes));
  const expected = [
    '{"op":"upload","kind":"module","source":"s","id":"upload_0"}',
    `{"op":"upload","kind":"library","blob":"${hex([0x7f, 0x45])}","id":"upload_1"}`,
    '{"op":"get_function","id":"get_function_2","module":{"$ref":"upload_0"},"name":"f","cpu_only":true}',
    '{"op":"get_function","id":"gid","module":{"$ref":"upload_1"},"name":"g"}',
    `{"op":"upload","id":"fid","kind":"file","blob":"${hex([1])}","path":"in/a.bin"}`,
    '{"op":"run","id":"run_3","fn":{"$ref":"get_function_2"},"args":[{"$ref":"fid"},1,"x",null,true,1180591620717411303424,2.0,{"b":1,"a":2},{"$ref":"raw"}]}',
    '{"op":"return","key":"v","value":{"$ref":"run_3"}}',
    '{"op":"return","key":"f","kind":"file","path":"out/r.txt"}',
    '{"op":"return","key":"d","kind":"folder","path":{"$ref":"fid"}}',
  ];
  assert.equal(p.toJson(), `{"instructions":[${expected.join(",")}]}`);
  assert.ok(
    p.toJson({ gpuCount: 1, outputLimitBytes: 0 }).endsWith(
      '{"$ref":"fid"}}],"options":{"gpu_count":1,"output_limit_bytes":0}}',
    ),
  );
  // instructions is a copy; instructions themselves are frozen.
  const list = p.instructions;
  list.pop();
  assert.equal(p.instructions.length, 9);
  assert.ok(Object.isFrozen(p.instructions[0]));
});

Deno.test("program: upload validation mirrors upstream (TypeError / ValidationError)", () => {
  const p = new Program();
  p.upload({ kind: "module", source: "" });
  const kinds = "upload kind must be 'module', 'tensor', 'bytes', or 'library'";
  const cases: [() => unknown, ErrorConstructor | typeof ValidationError, string][] = [
    [() => p.upload({ kind: "file" as "module", source: "" }), ValidationError, kinds],
    [() => p.upload({ kind: "module" }), TypeError, "module upload requires string 'source'"],
    [
      () => p.upload({ kind: "module", source: "", value: new Uint8Array(1) }),
      TypeError,
      "module upload does not accept tensor fields",
    ],
    [
      () => p.upload({ kind: "module", source: "", shape: [1] }),
      TypeError,
      "module upload does not accept tensor fields",
    ],
    [
      () => p.upload({ kind: "tensor", source: "", value: new Float32Array(1) }),
      TypeError,
      "tensor upload does not accept 'source'",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Uint8Array(4) }),
      TypeError,
      "raw tensor bytes require 'dtype' and 'shape'",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Uint8Array(4), dtype: "uint8" }),
      TypeError,
      "raw tensor bytes require 'dtype' and 'shape'",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Uint16Array(4) }),
      TypeError,
      "cannot upload 'Uint16Array' as a tensor; use {dtype, shape, data}",
    ],
    [
      () => p.upload({ kind: "tensor", value: [1, 2] }),
      TypeError,
      "cannot upload 'Array' as a tensor",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Float32Array(4), dtype: "float64" }),
      ValidationError,
      "declared dtype 'float64' does not match value dtype 'float32'",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Float32Array(4), shape: [3] }),
      ValidationError,
      "tensor metadata expects 12 bytes, got 16",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Float32Array(4), shape: [-4] }),
      ValidationError,
      "tensor shape must be an array of non-negative integers",
    ],
    [
      () => p.upload({ kind: "tensor", value: new Uint8Array(4), dtype: "uint16", shape: [2] }),
      ValidationError,
      "unsupported tensor dtype: 'uint16'",
    ],
    [
      () =>
        p.upload({
          kind: "tensor",
          value: { dtype: "int8", shape: [2], data: new Int8Array(2) },
          shape: [1, 2],
        }),
      ValidationError,
      "declared shape [1, 2] does not match value shape [2]",
    ],
    [
      () =>
        p.upload({
          kind: "tensor",
          value: new Tensor("int8", [2], new Int8Array(2)),
          dtype: "uint8",
        }),
      ValidationError,
      "declared dtype 'uint8' does not match value dtype 'int8'",
    ],
    [
      () => p.upload({ kind: "bytes", source: "x", value: new Uint8Array(1) }),
      TypeError,
      "bytes upload does not accept 'source'",
    ],
    [
      () => p.upload({ kind: "bytes", value: new Uint8Array(1), dtype: "uint8" }),
      TypeError,
      "bytes upload does not accept tensor fields",
    ],
    [
      () => p.upload({ kind: "bytes", value: "text" }),
      TypeError,
      "bytes upload requires a bytes-like 'value'",
    ],
    [
      () => p.upload({ kind: "library", value: undefined }),
      TypeError,
      "library upload requires a bytes-like 'value'",
    ],
    [
      () => p.upload({ kind: "library", value: new Uint8Array(1), shape: [1] }),
      TypeError,
      "library upload does not accept tensor fields",
    ],
  ];
  for (const [fn, type, message] of cases) unchanged(p, fn, type, message);
});

Deno.test("program: tensors from typed arrays, Tensor and {dtype, shape, data}", () => {
  const p = new Program();
  const cases: [unknown, string | undefined, number[] | undefined, string, number[]][] = [
    [new Float32Array([1, 2, 3, 4, 5, 6]), undefined, [2, 3], "float32", [2, 3]],
    [new Float64Array([1]), "float64", undefined, "float64", [1]],
    [new Int8Array(2), undefined, undefined, "int8", [2]],
    [new Int16Array(2), undefined, undefined, "int16", [2]],
    [new Int32Array(2), undefined, [1, 2, 1], "int32", [1, 2, 1]],
    [new BigInt64Array(2), undefined, undefined, "int64", [2]],
    [new Float16Array([1.5]), undefined, undefined, "float16", [1]],
    [new Float32Array(0), undefined, [0, 5], "float32", [0, 5]],
    [new Uint8Array([1, 0]), "bool", [2], "bool", [2]],
    [new ArrayBuffer(4), "bfloat16", [2], "bfloat16", [2]],
    [new DataView(new ArrayBuffer(8), 4), "int32", [1], "int32", [1]],
    [
      { dtype: "float8_e4m3fn", shape: [3], data: new Uint8Array(3) },
      undefined,
      undefined,
      "float8_e4m3fn",
      [3],
    ],
    [new Tensor("int64", [1], new BigInt64Array([-1n])), "int64", [1], "int64", [1]],
  ];
  for (const [value, dtype, shape, wireDtype, wireShape] of cases) {
    const r = p.upload({ kind: "tensor", value, dtype, shape });
    const instruction = p.instructions.at(-1)!;
    assert.equal(instruction.id, r.id);
    assert.equal(instruction.dtype, wireDtype);
    assert.deepEqual(instruction.shape, wireShape);
  }
  // Little-endian bytes, snapshotted at call time.
  const values = new Float32Array([1]);
  const q = new Program();
  q.upload({ kind: "tensor", value: values });
  values[0] = 2;
  assert.deepEqual([...q.blobs.values()][0], new Uint8Array([0, 0, 0x80, 0x3f]));
  const view = new Int16Array([0x0102, 0x0304]).subarray(1);
  q.upload({ kind: "tensor", value: view });
  assert.deepEqual([...q.blobs.values()][1], new Uint8Array([0x04, 0x03]));
  // The same bytes are stored once.
  q.upload({ kind: "bytes", value: new Uint8Array([0, 0, 0x80, 0x3f]) });
  assert.equal(q.blobs.size, 2);
});

Deno.test("program: uploadFile paths and conflicts", () => {
  const p = new Program();
  const reg = p.uploadFile({ blob: new Uint8Array([1]), path: "./a//b" });
  assert.ok(reg instanceof Register);
  assert.equal(p.instructions[0].path, "a/b");
  unchanged(
    p,
    () => p.uploadFile({ blob: new Uint8Array([2]), path: "a/b/" }),
    ValidationError,
    "duplicate file upload path: 'a/b'",
  );
  unchanged(
    p,
    () => p.uploadFile({ blob: new Uint8Array([2]), path: "a" }),
    ValidationError,
    "conflicting file upload paths: 'a/b' and 'a'",
  );
  unchanged(
    p,
    () => p.uploadFile({ blob: new Uint8Array([2]), path: "a/b/c" }),
    ValidationError,
    "conflicting file upload paths: 'a/b' and 'a/b/c'",
  );
  unchanged(
    p,
    () => p.uploadFile({ blob: new Uint8Array([2]), path: "../x" }),
    ValidationError,
    "filesystem 'path' must not contain a '..' component",
  );
  unchanged(
    p,
    () => p.uploadFile({ blob: "text" as unknown as Uint8Array, path: "x" }),
    TypeError,
    "file upload requires a bytes-like 'blob'",
  );
  unchanged(
    p,
    () => p.uploadFile({ blob: new Uint8Array([2]), path: "x", id: reg.id }),
    ValidationError,
    `duplicate instruction id: '${reg.id}'`,
  );
  p.uploadFile({ blob: new Uint8Array([2]), path: "a-b" });
  assert.equal(p.instructions.length, 2);
});

Deno.test("program: uploadFolder snapshots a tree, sorted, all or nothing", () => {
  const dir = Deno.makeTempDirSync();
  try {
    Deno.mkdirSync(`${dir}/assets/sub/empty`, { recursive: true });
    Deno.writeTextFileSync(`${dir}/assets/b.bin`, "b");
    Deno.writeTextFileSync(`${dir}/assets/.hidden`, "h");
    Deno.writeTextFileSync(`${dir}/assets/sub/a.txt`, "a");
    Deno.writeTextFileSync(`${dir}/assets/A.txt`, "b"); // same bytes as b.bin
    const p = new Program();
    p.upload({ kind: "module", source: "" });
    p.uploadFolder(`${dir}/assets`, { path: "./inputs/" });
    const uploads = p.instructions.slice(1);
    assert.deepEqual(uploads.map((i) => [i.path, i.id]), [
      ["inputs/.hidden", "upload_1"],
      ["inputs/A.txt", "upload_2"],
      ["inputs/b.bin", "upload_3"],
      ["inputs/sub/a.txt", "upload_4"],
    ]);
    assert.deepEqual(Object.keys(uploads[0]), ["op", "kind", "blob", "path", "id"]);
    assert.equal(uploads[0].blob, sha256Hex(new TextEncoder().encode("h")));
    assert.equal(p.blobs.size, 3);
    // Later changes to the files do not change the program.
    Deno.writeTextFileSync(`${dir}/assets/b.bin`, "changed");
    assert.equal(p.blobs.get(uploads[2].blob as string)![0], 0x62);

    // Conflicts with earlier uploads leave the program unchanged.
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/assets`, { path: "inputs" }),
      ValidationError,
      "duplicate file upload path: 'inputs/.hidden'",
    );
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/assets`, { path: "inputs/sub/a.txt" }),
      ValidationError,
      "conflicting file upload paths: 'inputs/sub/a.txt' and 'inputs/sub/a.txt/.hidden'",
    );
    // Symbolic links anywhere, and a linked root, are rejected.
    Deno.symlinkSync(`${dir}/assets/b.bin`, `${dir}/assets/sub/link`);
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/assets`, { path: "other" }),
      ValidationError,
      "upload_folder rejects symbolic links and special files: other/sub/link",
    );
    Deno.removeSync(`${dir}/assets/sub/link`);
    Deno.symlinkSync(`${dir}/assets`, `${dir}/linked`);
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/linked`, { path: "other" }),
      ValidationError,
      `upload_folder rejects symbolic links: ${dir}/linked`,
    );
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/assets/b.bin`, { path: "other" }),
      Deno.errors.NotADirectory as ErrorConstructor,
    );
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/missing`, { path: "other" }),
      Deno.errors.NotFound as ErrorConstructor,
    );
    unchanged(
      p,
      () => p.uploadFolder(`${dir}/assets`, { path: "/abs" }),
      ValidationError,
      "filesystem 'path' must be relative",
    );
    // An empty folder adds nothing; a file URL works too.
    p.uploadFolder(new URL(`file://${dir}/assets/sub/empty`), { path: "e" });
    assert.equal(p.instructions.length, 5);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("program: getFunction, run and returns validate references", () => {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "" });
  const fn = p.getFunction({ module: mod, name: "f" });
  const foreign = new Program().upload({ kind: "module", source: "", id: "elsewhere" });
  const cases: [() => unknown, ErrorConstructor | typeof ValidationError, string][] = [
    [
      () => p.getFunction({ module: "upload_0" as unknown as Register, name: "f" }),
      TypeError,
      "module must be a Register or {'$ref': id}",
    ],
    [
      () => p.getFunction({ module: { $ref: "upload_0", x: 1 } as unknown as Register, name: "f" }),
      TypeError,
      "module must be a Register or {'$ref': id}",
    ],
    [
      () => p.getFunction({ module: foreign, name: "f" }),
      ValidationError,
      "get_function None references unknown handle 'elsewhere'",
    ],
    [
      () => p.getFunction({ module: foreign, name: "f", id: "g" }),
      ValidationError,
      "get_function 'g' references unknown handle 'elsewhere'",
    ],
    [
      () => p.getFunction({ module: mod, name: "" }),
      ValidationError,
      "function name must be a non-empty string",
    ],
    [
      () => p.getFunction({ module: mod, name: "f", cpuOnly: "yes" as unknown as boolean }),
      TypeError,
      "cpu_only must be a bool",
    ],
    [
      () => p.run({ fn: { $ref: "get_function_1" } as unknown as Register }),
      TypeError,
      "fn must be a Register",
    ],
    [
      () => p.run({ fn: foreign }),
      ValidationError,
      "run None references unknown handle 'elsewhere'",
    ],
    [
      () => p.run({ fn, args: [foreign] }),
      ValidationError,
      "run None references unknown handle 'elsewhere'",
    ],
    [
      () => p.run({ fn, args: "x" as unknown as unknown[] }),
      TypeError,
      "run args must be an array",
    ],
    [
      () => p.run({ fn, args: [[mod]] }),
      TypeError,
      "registers are only allowed as top-level run arguments",
    ],
    [
      () => p.run({ fn, args: [{ a: NaN }] }),
      ValidationError,
      "out of range float values are not JSON compliant: NaN",
    ],
    [() => p.run({ fn, args: [undefined] }), TypeError, "undefined is not a JSON value"],
    [() => p.run({ fn, args: [new Date(0)] }), TypeError, "Date is not a JSON value"],
    [() => p.run({ fn, args: [new Map([[1, 2]])] }), TypeError, "JSON object keys must be strings"],
    [
      () => p.return_({ key: "", value: mod }),
      ValidationError,
      "return key must be a non-empty string",
    ],
    [
      () => p.return_({ key: "k", value: "upload_0" as unknown as Register }),
      TypeError,
      "return value must be a Register or {'$ref': id}",
    ],
    [
      () => p.return_({ key: "k", value: foreign }),
      ValidationError,
      "return 'k' references unknown handle 'elsewhere'",
    ],
    [
      () => p.returnFile({ key: "k", path: foreign }),
      ValidationError,
      "return 'k' references unknown handle 'elsewhere'",
    ],
    [
      () => p.returnFolder({ key: "k", path: "a/../b" }),
      ValidationError,
      "filesystem 'path' must not contain a '..' component",
    ],
    [
      () => p.returnFile({ key: "k", path: 5 as unknown as string }),
      ValidationError,
      "filesystem 'path' must be a non-empty string",
    ],
  ];
  for (const [fn, type, message] of cases) unchanged(p, fn, type, message);
  const cyclic: unknown[] = [];
  cyclic.push(cyclic);
  unchanged(
    p,
    () => p.run({ fn, args: [cyclic] }),
    ValidationError,
    "JSON values cannot contain circular containers",
  );
  p.return_({ key: "k", value: mod });
  unchanged(
    p,
    () => p.returnFile({ key: "k", path: "x" }),
    ValidationError,
    "duplicate return key: 'k'",
  );
  // Return keys and handle ids are separate namespaces.
  p.return_({ key: fn.id, value: fn });
  // Literal arguments are snapshotted.
  const literal = { a: [1] };
  p.run({ fn, args: [literal] });
  literal.a.push(2);
  assert.ok(p.toJson().includes('"args":[{"a":[1]}]'));
});
