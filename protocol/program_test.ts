import assert from "node:assert/strict";
import {
  checkPathConflicts,
  normalizeFilePath,
  parseProgram,
  PathError,
  ProgramError,
} from "./mod.ts";
import { isBlobHash } from "./program.ts";

const A = "a".repeat(64);
const B = "b".repeat(64);
const MOD = { op: "upload", kind: "module", source: "def f(x):\n    return x\n", id: "m" };
const FN = { op: "get_function", id: "g", module: { $ref: "m" }, name: "f" };

/** A program text from instructions (objects or raw JSON text) and optional options. */
function text(instructions: unknown[], options?: string): string {
  const items = instructions.map((item) => typeof item === "string" ? item : JSON.stringify(item));
  return `{"instructions":[${items.join(",")}]${
    options === undefined ? "" : `,"options":${options}`
  }}`;
}

function rejects(input: string, message: string): void {
  assert.throws(() => parseProgram(input), (error: unknown) => {
    assert.ok(error instanceof ProgramError, `${input}: ${error}`);
    assert.equal(error.message, message, input);
    return true;
  });
}

Deno.test("program: top level and options (spec §2.3)", () => {
  const cases: [string, string][] = [
    ["[]", "program must be a JSON object"],
    ["{}", "program is missing field(s): instructions"],
    ['{"x":1,"instructions":[],"a":2}', "program has unknown field(s): a, x"],
    ['{"instructions":[]}', "'instructions' must be a non-empty array"],
    ['{"instructions":{}}', "'instructions' must be a non-empty array"],
    [text([MOD], "null"), "'options' must be an object"],
    [text([MOD], '{"gpu":1,"timeout":2}'), "options has unknown field(s): gpu, timeout"],
    // options are validated before any instruction
    [text([5], '{"gpu_count":0}'), "'gpu_count' must be an integer between 1 and 8"],
    ...["9", "true", "1.0", '"2"', "null"].map((v): [string, string] => [
      text([MOD], `{"gpu_count":${v}}`),
      "'gpu_count' must be an integer between 1 and 8",
    ]),
    ...["0", "-1", "0.0", "true", '"5"', "1e400", "-1e400", "null"].map((v): [string, string] => [
      text([MOD], `{"timeout_seconds":${v}}`),
      "'timeout_seconds' must be a finite positive number",
    ]),
    ...["-1", "1.0", "true", '"1"'].map((v): [string, string] => [
      text([MOD], `{"output_limit_bytes":${v}}`),
      "'output_limit_bytes' must be a non-negative integer",
    ]),
    ['{"instructions":[NaN]}', "non-finite number NaN is not allowed"],
    ['{"instructions":[{"op":"upload","op":"run"}]}', "duplicate JSON key: 'op'"],
    ['{"instructions":[', "malformed JSON: Expecting value: line 1 column 18 (char 17)"],
  ];
  for (const [input, message] of cases) rejects(input, message);
  const options = parseProgram(
    text(
      [MOD],
      '{"gpu_count":8,"timeout_seconds":1000000000000000000000000000000,"output_limit_bytes":0}',
    ),
  ).options;
  assert.deepEqual(options, { gpuCount: 8, timeoutSeconds: 1e30, outputLimitBytes: 0 });
  assert.deepEqual(parseProgram(text([MOD], '{"timeout_seconds":0.5}')).options, {
    timeoutSeconds: 0.5,
  });
});

Deno.test("program: instruction basics, ids and ops (spec §2.4)", () => {
  const cases: [unknown[], string][] = [
    [[5], "instruction 0 must be an object"],
    [[MOD, "[]"], "instruction 1 must be an object"],
    [[{ op: "bogus" }], "instruction 0: unknown op 'bogus'"],
    [[{ id: "x" }], "instruction 0: unknown op None"],
    [[{ op: 5 }], "instruction 0: unknown op 5"],
    [[{ op: ["run"] }], "instruction 0: unknown op ['run']"],
    [[{ op: { a: 1.5 } }], "instruction 0: unknown op {'a': 1.5}"],
    [[{ op: "upload", kind: "module", source: "" }], "instruction 0 needs a non-empty string 'id'"],
    [[{ op: "run", id: "", fn: { $ref: "m" } }], "instruction 0 needs a non-empty string 'id'"],
    [[{ op: "get_function", id: 7 }], "instruction 0 needs a non-empty string 'id'"],
    [[MOD, { ...MOD }], "duplicate instruction id: 'm'"],
    [[MOD, { ...FN, id: "it's" }, { ...FN, id: "it's" }], `duplicate instruction id: "it's"`],
  ];
  for (const [instructions, message] of cases) rejects(text(instructions), message);
  // Return keys are a separate namespace from handle ids.
  const parsed = parseProgram(text([MOD, { op: "return", key: "m", value: { $ref: "m" } }]));
  // Only the ops present, in first-appearance order (upstream's Counter in request_accepted).
  assert.deepEqual(parsed.ops, { upload: 1, return: 1 });
  assert.deepEqual(
    Object.keys(parsed.ops),
    Object.keys(parsed.ops).toSorted((a, b) =>
      parsed.instructions.findIndex((i) => i.op === a) -
      parsed.instructions.findIndex((i) => i.op === b)
    ),
  );
});

Deno.test("program: uploads (spec §2.4 upload)", () => {
  const up = (fields: Record<string, unknown>) => ({ op: "upload", id: "u", ...fields });
  const cases: [unknown, string][] = [
    [up({ kind: "folder" }), "upload 'u': unknown kind 'folder'"],
    [up({}), "upload 'u': unknown kind None"],
    [
      up({ kind: "module", source: "", language: "python", entry: "f" }),
      "instruction 0 has unknown field(s): entry, language",
    ],
    [up({ kind: "module", language: "python" }), "instruction 0 has unknown field(s): language"],
    [up({ kind: "module" }), "instruction 0 is missing field(s): source"],
    [up({ kind: "module", source: 5 }), "module upload 'u': 'source' must be a string"],
    [up({ kind: "tensor", blob: A }), "instruction 0 is missing field(s): dtype, shape"],
    [
      up({ kind: "tensor", blob: A.toUpperCase(), dtype: "float32", shape: [] }),
      "tensor upload 'u': 'blob' must be a lowercase SHA-256 digest",
    ],
    [
      up({ kind: "tensor", blob: A + "0", dtype: "float32", shape: [] }),
      "tensor upload 'u': 'blob' must be a lowercase SHA-256 digest",
    ],
    [
      up({ kind: "tensor", blob: A, dtype: "uint16", shape: [] }),
      "tensor upload 'u': unsupported dtype 'uint16'",
    ],
    [
      up({ kind: "tensor", blob: A, dtype: 4, shape: [] }),
      "tensor upload 'u': unsupported dtype 4",
    ],
    [
      up({ kind: "tensor", blob: A, dtype: "toString", shape: [] }),
      "tensor upload 'u': unsupported dtype 'toString'",
    ],
    ...[[-1], [true], "4", null, [[2]]].map((shape): [unknown, string] => [
      up({ kind: "tensor", blob: A, dtype: "float32", shape }),
      "tensor upload 'u': 'shape' must be an array of non-negative integers",
    ]),
    [up({ kind: "bytes", blob: 5 }), "bytes upload 'u': 'blob' must be a lowercase SHA-256 digest"],
    [
      up({ kind: "library", blob: "" }),
      "library upload 'u': 'blob' must be a lowercase SHA-256 digest",
    ],
    [up({ kind: "bytes", blob: A, dtype: "uint8" }), "instruction 0 has unknown field(s): dtype"],
    [up({ kind: "file", blob: A }), "instruction 0 is missing field(s): path"],
    [
      up({ kind: "file", blob: "x", path: "a" }),
      "file upload: 'blob' must be a lowercase SHA-256 digest",
    ],
    [
      up({ kind: "file", blob: A, path: "../a" }),
      "filesystem 'path' must not contain a '..' component",
    ],
    [
      { op: "upload", kind: "file", blob: A, path: "a" },
      "instruction 0 needs a non-empty string 'id'",
    ],
  ];
  for (const [instruction, message] of cases) rejects(text([instruction]), message);
  // A float-spelled dimension is a Python float, not an int.
  rejects(
    text([
      `{"op":"upload","id":"u","kind":"tensor","blob":"${A}","dtype":"float32","shape":[4.0]}`,
    ]),
    "tensor upload 'u': 'shape' must be an array of non-negative integers",
  );
});

Deno.test("program: get_function, run and references (spec §2.4)", () => {
  const cases: [unknown[], string][] = [
    [[MOD, { ...FN, module: "m" }], "get_function 'g': 'module' must be {'$ref': id}"],
    [[MOD, { ...FN, module: { $ref: "" } }], "get_function 'g': 'module' must be {'$ref': id}"],
    [
      [MOD, { ...FN, module: { $ref: "m", x: 1 } }],
      "get_function 'g': 'module' must be {'$ref': id}",
    ],
    [[MOD, { ...FN, name: "" }], "get_function 'g': 'name' must be a non-empty string"],
    [
      [MOD, { ...FN, module: { $ref: "zz" }, name: "" }],
      "get_function 'g': 'name' must be a non-empty string",
    ],
    [[MOD, { ...FN, cpu_only: "yes" }], "get_function 'g': 'cpu_only' must be a boolean"],
    [[MOD, { ...FN, language: "python" }], "instruction 1 has unknown field(s): language"],
    [
      [MOD, { op: "get_function", id: "g", module: { $ref: "m" } }],
      "instruction 1 is missing field(s): name",
    ],
    [[MOD, { ...FN, module: { $ref: "zz" } }], "'g' references unknown/forward handle 'zz'"],
    [[{ ...FN, module: { $ref: "m" } }, MOD], "'g' references unknown/forward handle 'm'"],
    [[MOD, FN, { op: "run", id: "r", fn: "builtin.randn" }], "run 'r': 'fn' must be {'$ref': id}"],
    [
      [MOD, FN, { op: "run", id: "r", fn: { $ref: "r" } }],
      "'r' references unknown/forward handle 'r'",
    ],
    [
      [MOD, FN, { op: "run", id: "r", fn: { $ref: "g" }, args: {} }],
      "run 'r': 'args' must be an array",
    ],
    [
      [MOD, FN, { op: "run", id: "r", fn: { $ref: "g" }, args: [{ $ref: "q" }] }],
      "'r' references unknown/forward handle 'q'",
    ],
    [
      [MOD, FN, { op: "run", id: "r", fn: { $ref: "g" }, kwargs: {} }],
      "instruction 2 has unknown field(s): kwargs",
    ],
    [
      [MOD, FN, `{"op":"run","id":"r","fn":{"$ref":"g"},"args":[1e400]}`],
      "run 'r' argument contains a non-finite number",
    ],
    [
      [MOD, FN, `{"op":"run","id":"r","fn":{"$ref":"g"},"args":[{"a":[-1e999]}]}`],
      "run 'r' argument contains a non-finite number",
    ],
  ];
  for (const [instructions, message] of cases) rejects(text(instructions), message);
  // Nested reference-shaped values are literals; args are optional; cpu_only false is fine.
  const parsed = parseProgram(text([
    MOD,
    { ...FN, cpu_only: false },
    { op: "run", id: "r", fn: { $ref: "g" }, args: [[{ $ref: "nope" }], { $ref: "m" }, 1e300] },
    { op: "run", id: "r2", fn: { $ref: "r" } },
  ]));
  assert.deepEqual(parsed.ops, { upload: 1, get_function: 1, run: 2 });
});

Deno.test("program: returns (spec §2.4 return)", () => {
  const ret = (fields: Record<string, unknown>) => ({ op: "return", ...fields });
  const cases: [unknown[], string][] = [
    [[MOD, ret({ key: "k" })], "instruction 1 is missing field(s): value"],
    [
      [MOD, ret({ key: "k", value: { $ref: "m" }, id: "x" })],
      "instruction 1 has unknown field(s): id",
    ],
    [
      [MOD, ret({ key: "", value: { $ref: "m" } })],
      "return instruction 1 needs a non-empty string 'key'",
    ],
    [
      [MOD, ret({ key: 3, value: { $ref: "m" } })],
      "return instruction 1 needs a non-empty string 'key'",
    ],
    [
      [MOD, ret({ key: "k", value: { $ref: "m" } }), ret({ key: "k", value: { $ref: "m" } })],
      "duplicate return key: 'k'",
    ],
    [[MOD, ret({ key: "k", value: "m" })], "return 'k': 'value' must be {'$ref': id}"],
    [
      [MOD, ret({ key: "k", value: { $ref: "x" } })],
      `"return 'k'" references unknown/forward handle 'x'`,
    ],
    [[MOD, ret({ key: "k", kind: "file" })], "instruction 1 is missing field(s): path"],
    [
      [MOD, ret({ key: "k", kind: "file", path: "a", value: { $ref: "m" } })],
      "instruction 1 has unknown field(s): value",
    ],
    [[MOD, ret({ key: "k", kind: "tensor", path: "a" })], "return 'k': unknown kind 'tensor'"],
    [[MOD, ret({ key: "k", kind: "folder", path: "/etc" })], "filesystem 'path' must be relative"],
    [
      [MOD, ret({ key: "k", kind: "file", path: { $ref: "p" } })],
      `"return 'k'" references unknown/forward handle 'p'`,
    ],
  ];
  for (const [instructions, message] of cases) rejects(text(instructions), message);
  // Return paths are not conflict-checked; a path may come from a register.
  parseProgram(text([
    MOD,
    ret({ key: "a", kind: "file", path: "x" }),
    ret({ key: "b", kind: "folder", path: "./x" }),
    ret({ key: "c", kind: "file", path: { $ref: "m" } }),
  ]));
});

Deno.test("program: file-upload path conflicts, checked after every instruction", () => {
  const file = (id: string, path: string) => ({ op: "upload", id, kind: "file", blob: A, path });
  rejects(text([file("a", "a/b"), file("b", "./a//b")]), "duplicate file upload path: 'a/b'");
  rejects(
    text([file("a", "a/b"), file("b", "a-b"), file("c", "a")]),
    "conflicting file upload paths: 'a' and 'a/b'",
  );
  rejects(
    text([file("a", "x"), file("b", "x"), { op: "bogus" }]),
    "instruction 2: unknown op 'bogus'",
  );
  assert.deepEqual(parseProgram(text([file("a", "a-b"), file("b", "a/c")])).filePaths, [
    "a-b",
    "a/c",
  ]);
});

Deno.test("program: ParsedProgram of the spec §10 example", () => {
  const parsed = parseProgram(
    '{"instructions":[{"op":"upload","kind":"module","source":"def add_one(x):\\n    return x + 1\\n","id":"upload_0"},{"op":"get_function","id":"get_function_1","module":{"$ref":"upload_0"},"name":"add_one"},{"op":"upload","kind":"tensor","blob":"ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1","dtype":"float32","shape":[4],"id":"upload_2"},{"op":"run","id":"run_3","fn":{"$ref":"get_function_1"},"args":[{"$ref":"upload_2"}]},{"op":"return","key":"y","value":{"$ref":"run_3"}}],"options":{"timeout_seconds":30}}',
  );
  assert.deepEqual(parsed, {
    instructionCount: 5,
    ops: { upload: 2, get_function: 1, run: 1, return: 1 },
    uploads: { module: 1, tensor: 1 },
    instructions: [
      { op: "upload", id: "upload_0" },
      { op: "get_function", id: "get_function_1" },
      { op: "upload", id: "upload_2" },
      { op: "run", id: "run_3" },
      { op: "return", id: null },
    ],
    options: { timeoutSeconds: 30 },
    blobs: [{
      sha256: "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1",
      uses: new Set(["tensor"]),
      tensorByteLengths: [16],
    }],
    filePaths: [],
    tensorUploads: [{
      id: "upload_2",
      sha256: "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1",
      dtype: "float32",
      shape: [4],
      byteLength: 16,
    }],
    leaseFirst: true,
  });
});

Deno.test("program: blob references in first-appearance order with every use", () => {
  const parsed = parseProgram(text([
    { op: "upload", id: "f", kind: "file", blob: B, path: "./in/x.bin" },
    { op: "upload", id: "t1", kind: "tensor", blob: A, dtype: "bfloat16", shape: [2, 4] },
    { op: "upload", id: "t2", kind: "tensor", blob: B, dtype: "int64", shape: [0, 3] },
    { op: "upload", id: "b", kind: "bytes", blob: A },
    { op: "upload", id: "l", kind: "library", blob: B },
    `{"op":"upload","id":"t3","kind":"tensor","blob":"${A}","dtype":"uint8","shape":[4294967296,4294967296]}`,
  ]));
  assert.deepEqual(parsed.blobs, [
    { sha256: B, uses: new Set(["file", "tensor", "library"]), tensorByteLengths: [0] },
    { sha256: A, uses: new Set(["tensor", "bytes"]), tensorByteLengths: [16, Infinity] },
  ]);
  assert.deepEqual(parsed.filePaths, ["in/x.bin"]);
  assert.deepEqual(parsed.tensorUploads.map((t) => [t.id, t.sha256, t.byteLength]), [
    ["t1", A, 16],
    ["t2", B, 0],
    ["t3", A, Infinity],
  ]);
  assert.deepEqual(parsed.uploads, { tensor: 3, bytes: 1, library: 1, file: 1 });
});

Deno.test("paths: the rules of spec §2.6 with upstream's messages", () => {
  const ok: [string, string][] = [
    ["./data//x.bin", "data/x.bin"],
    ["a/./b/", "a/b"],
    [".hidden", ".hidden"],
    ["a/...", "a/..."],
    ["é".repeat(127), "é".repeat(127)],
  ];
  for (const [input, output] of ok) assert.equal(normalizeFilePath(input), output);
  const bad: [unknown, string][] = [
    ["", "filesystem 'path' must be a non-empty string"],
    [5, "filesystem 'path' must be a non-empty string"],
    [null, "filesystem 'path' must be a non-empty string"],
    ["a\x00b", "filesystem 'path' must not contain NUL"],
    ["a\\b", "filesystem 'path' must use POSIX '/' separators"],
    ["/abs", "filesystem 'path' must be relative"],
    ["a/../b", "filesystem 'path' must not contain a '..' component"],
    ["..", "filesystem 'path' must not contain a '..' component"],
    ["././/", "filesystem 'path' must name a file or folder"],
    ["x".repeat(256), "filesystem 'path' contains a component longer than 255 bytes"],
    ["é".repeat(128), "filesystem 'path' contains a component longer than 255 bytes"],
    [Array(20).fill("y".repeat(250)).join("/"), "filesystem 'path' is longer than 4096 bytes"],
    ["a\ud800", "filesystem 'path' must not contain unpaired surrogates"],
  ];
  for (const [input, message] of bad) {
    assert.throws(() => normalizeFilePath(input), (error: unknown) => {
      assert.ok(error instanceof PathError);
      assert.equal(error.message, message);
      return true;
    });
  }
  // Component-list order puts a file right before its descendants.
  checkPathConflicts(["a-b", "a.c", "a/b", "b"]);
  assert.throws(
    () => checkPathConflicts(["a/b/c", "a-b", "a/b"]),
    /conflicting file upload paths: 'a\/b' and 'a\/b\/c'/,
  );
});

Deno.test("program: isBlobHash", () => {
  if (!isBlobHash("a".repeat(64)) || isBlobHash("A".repeat(64))) throw new Error();
});
