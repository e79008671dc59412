import assert from "node:assert/strict";
import {
  cacheMissJson,
  decodeJsonObject,
  decodeMissingBlobs,
  decodeProgramResult,
  decodeResponseBody,
  decodeServerError,
  encodeExecuteResponse,
  encodeMultipart,
  ERROR_FIELDS,
  ERROR_MESSAGES,
  errorBody,
  GPU_ACCESS_FIELDS,
  type MultipartInput,
  parseJsonTyped,
  type ResponseBody,
  ResponseError,
  type ResultFields,
  resultJson,
  sha256Hex,
  type TypedJsonObject,
  type ValueFactories,
} from "./mod.ts";

const enc = new TextEncoder();

type Node =
  | { tensor: [string, number[], number[]] }
  | { bytes: number[] }
  | { file: number[] }
  | { folder: [[string, Node][], string[]] };

/** Factories that keep enough to check what was decoded. */
const factories: ValueFactories<Node> = {
  tensor: (dtype, shape, data) => ({
    tensor: [
      dtype,
      shape,
      dtype === "float32" ? [...new Float32Array(data.slice().buffer)] : [...data],
    ],
  }),
  bytes: (data) => ({ bytes: [...data] }),
  file: (data) => ({ file: [...data] }),
  folder: (files, directories) => ({ folder: [[...files], directories] }),
};

const FIELDS: [string, string][] = [
  ["status", '"COMPLETED"'],
  ["request_id", '"r1"'],
  ["queue_ms", "0.5"],
  ["elapsed_ms", "2"],
  ["lease_wait_ms", "0.0"],
  ["lease_held_ms", "1.25"],
  ["stdout", '"out"'],
  ["stderr", '""'],
  ["stdout_truncated", "false"],
  ["stderr_truncated", "true"],
  ["results", "{}"],
];

/** A result body: base fields with `changes` applied (undefined removes a key; new keys appended). */
function body(changes: Record<string, string | undefined> = {}): string {
  const fields = new Map(FIELDS);
  for (const [key, value] of Object.entries(changes)) {
    if (value === undefined) fields.delete(key);
    else fields.set(key, value);
  }
  return "{" + [...fields].map(([key, value]) => `${JSON.stringify(key)}:${value}`).join(",") + "}";
}

function decode(text: string, parts: Uint8Array[] = []) {
  const encoded = encodeExecuteResponse(text, parts);
  const response = decodeResponseBody(encoded.contentType, encoded.body);
  return decodeProgramResult(response.body, response.parts, factories);
}

function binary(data: number[], index: number, type = "bytes", extra = ""): string {
  const hash = sha256Hex(new Uint8Array(data));
  return `{"type":"${type}","part":"return:${index}","sha256":"${hash}"${extra}}`;
}

function malformed(text: string, parts: Uint8Array[], detail: string): void {
  assert.throws(() => decode(text, parts), (error: unknown) => {
    assert.ok(error instanceof ResponseError, `${text}: ${error}`);
    assert.equal(error.message, `malformed execution response: ${detail}`, text);
    return true;
  });
}

const SPEC_RESULT =
  '{"status":"COMPLETED","request_id":"5e2d8c41-7a9b-4c0d-8e1f-3b6a2d9c4e75","queue_ms":0.21,"elapsed_ms":153.7,"lease_wait_ms":0.0,"lease_held_ms":148.9,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"results":{"y":{"type":"tensor","part":"return:0","sha256":"1180e36f58837887478f2d0dc12271b6ec4b103f20b533f8af7d44c313e27c18","dtype":"float32","shape":[4]}}}';
const SPEC_TENSOR = new Uint8Array([
  0,
  0,
  0,
  0x40,
  0,
  0,
  0x40,
  0x40,
  0,
  0,
  0x80,
  0x40,
  0,
  0,
  0xa0,
  0x40,
]);

Deno.test("response: resultJson reproduces the spec §10 body byte for byte", () => {
  const text = resultJson({
    status: "COMPLETED",
    requestId: "5e2d8c41-7a9b-4c0d-8e1f-3b6a2d9c4e75",
    queueMs: 0.21,
    elapsedMs: 153.7,
    leaseWaitMs: 0,
    leaseHeldMs: 148.9,
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    resultsJson:
      '{"y":{"type":"tensor","part":"return:0","sha256":"1180e36f58837887478f2d0dc12271b6ec4b103f20b533f8af7d44c313e27c18","dtype":"float32","shape":[4]}}',
  });
  assert.equal(text, SPEC_RESULT);
  assert.equal(
    sha256Hex(SPEC_TENSOR),
    "1180e36f58837887478f2d0dc12271b6ec4b103f20b533f8af7d44c313e27c18",
  );
});

Deno.test("response: FAILED and multi-GPU bodies, CACHE_MISS and ERROR bodies", () => {
  const failed = resultJson({
    status: "FAILED",
    requestId: "r",
    queueMs: 1,
    elapsedMs: 1e-5,
    leaseWaitMs: 2.5e16,
    leaseHeldMs: 0,
    stdout: "é",
    stderr: "\n",
    stdoutTruncated: true,
    stderrTruncated: false,
    gpuIds: [3, 1],
    resultsJson: "{}",
    errorJson: '{"kind":"engine"}',
  });
  assert.equal(
    failed,
    '{"status":"FAILED","request_id":"r","queue_ms":1.0,"elapsed_ms":1e-05,"lease_wait_ms":2.5e+16,"lease_held_ms":0.0,"stdout":"é","stderr":"\\n","stdout_truncated":true,"stderr_truncated":false,"gpu_ids":[3,1],"gpu_count":2,"results":{},"error":{"kind":"engine"}}',
  );
  const base = {
    status: "COMPLETED" as const,
    requestId: "r",
    queueMs: 0,
    elapsedMs: 0,
    leaseWaitMs: 0,
    leaseHeldMs: 0,
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    resultsJson: "{}",
  };
  assert.throws(() => resultJson({ ...base, errorJson: "{}" }), TypeError);
  assert.throws(() => resultJson({ ...base, status: "FAILED" }), TypeError);
  assert.throws(() => resultJson({ ...base, queueMs: NaN }), TypeError);
  assert.equal(
    cacheMissJson("0b6f", ["a".repeat(64), "b".repeat(64)]),
    `{"status":"CACHE_MISS","request_id":"0b6f","missing_blobs":["${"a".repeat(64)}","${
      "b".repeat(64)
    }"]}`,
  );
  assert.equal(
    errorBody("id", "request_too_large", ERROR_MESSAGES.requestTooLarge),
    '{"status":"ERROR","request_id":"id","error":{"kind":"request_too_large","message":"request exceeds the configured size limit"}}',
  );
  assert.equal(encodeExecuteResponse(failed, []).contentType, "application/json");
});

Deno.test("response: decoding the spec §10 multipart response gives float32 [2, 3, 4, 5]", () => {
  const boundary = "kcoral-9d1c0e6b2a4f48e7b3c5d7f9a1b2c3d4";
  const bytes = new Uint8Array([
    ...enc.encode(
      `--${boundary}\r\nContent-Disposition: form-data; name="result"\r\nContent-Type: application/json\r\n\r\n${SPEC_RESULT}\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="return:0"\r\nContent-Type: application/octet-stream\r\n\r\n`,
    ),
    ...SPEC_TENSOR,
    ...enc.encode(`\r\n--${boundary}--\r\n`),
  ]);
  const response = decodeResponseBody(`multipart/form-data; boundary=${boundary}`, bytes);
  const result = decodeProgramResult(response.body, response.parts, factories);
  assert.deepEqual(result.results.get("y"), { tensor: ["float32", [4], [2, 3, 4, 5]] });
  assert.equal(result.requestId, "5e2d8c41-7a9b-4c0d-8e1f-3b6a2d9c4e75");
  assert.deepEqual(
    [result.queueMs, result.elapsedMs, result.leaseWaitMs, result.leaseHeldMs],
    [0.21, 153.7, 0, 148.9],
  );
  assert.equal(result.error, null);
  assert.deepEqual(result.gpuIds, []);
});

Deno.test("response: scalar values decode by type, not by JSON spelling", () => {
  const result = decode(body({
    results: '{"n":{"type":"null"},"t":{"type":"boolean","value":true},' +
      '"i":{"type":"integer","value":12345678901234567890},"f":{"type":"number","value":1},' +
      '"g":{"type":"number","value":2.5},"s":{"type":"string","value":"é"},' +
      '"a":{"type":"array","value":[{"type":"integer","value":1}]},' +
      '"o":{"type":"object","value":{"2":{"type":"null"},"1":{"type":"null"}}}}',
    stdout_truncated: undefined,
    stderr_truncated: undefined,
  }));
  assert.deepEqual([...result.results], [
    ["n", null],
    ["t", true],
    ["i", 12345678901234567890n],
    ["f", 1],
    ["g", 2.5],
    ["s", "é"],
    ["a", [1]],
    ["o", new Map([["2", null], ["1", null]])],
  ]);
  assert.equal(result.stdoutTruncated, false);
  assert.equal(result.stderrTruncated, false);
});

Deno.test("response: return:k numbering is depth-first in JSON text order (integer-like keys too)", () => {
  const p = [[1], [2], [3], [4]];
  const parts = p.map((data) => new Uint8Array(data));
  const results = `{"b":${binary(p[0], 0)},"1":{"type":"array","value":[${binary(p[1], 1)},` +
    `{"type":"object","value":{"9":${binary(p[2], 2)}}}]},"0":${binary(p[3], 3)}}`;
  const result = decode(body({ results }), parts);
  assert.deepEqual([...result.results.keys()], ["b", "1", "0"]);
  assert.deepEqual(result.results.get("b"), { bytes: [1] });
  assert.deepEqual(result.results.get("0"), { bytes: [4] });
  // JS object order ("0", "1", "b") would number them differently: rejected.
  const swapped = `{"b":${binary(p[1], 1)},"0":${binary(p[0], 0)}}`;
  malformed(
    body({ results: swapped }),
    parts.slice(0, 2),
    "binary values are not numbered in depth-first order",
  );
});

Deno.test("response: a folder with sorted keys round-trips", () => {
  const files: [string, number[]][] = [["10.txt", [1]], ["9.txt", [2]], ["a/x", [3]], [
    "a/y/z",
    [],
  ]];
  const filesJson = files.map(([path, data], i) =>
    `${JSON.stringify(path)}:${binary(data, i, "file", `,"size":${data.length}`)}`
  );
  const results = `{"dir":{"type":"folder","files":{${
    filesJson.join(",")
  }},"directories":["a","a/empty","a/y"]}}`;
  const result = decode(body({ results }), files.map(([, data]) => new Uint8Array(data)));
  assert.deepEqual(result.results.get("dir"), {
    folder: [files.map(([path, data]) => [path, { file: data }]), ["a", "a/empty", "a/y"]],
  });
  const empty = decode(body({ results: '{"e":{"type":"folder","files":{},"directories":[]}}' }));
  assert.deepEqual(empty.results.get("e"), { folder: [[], []] });
});

Deno.test("response: every semantic check of upstream's client (spec §3.3, §3.4)", () => {
  const error =
    '{"kind":"engine","message":"ValueError: bad","instruction_index":3,"instruction_op":"run","instruction_id":"run_3","traceback":"T"}';
  const gpuError =
    '{"kind":"gpu_access","message":"m","instruction_index":0,"instruction_op":"run","instruction_id":null,"traceback":"","cuda_call":"cuMemAlloc","location":"x.py:1","interfered_request_id":null}';
  const cases: [Record<string, string | undefined>, string][] = [
    [{ status: undefined }, "'status'"],
    [{ status: '"ERROR"' }, "unexpected program status 'ERROR'"],
    [{ status: "null" }, "unexpected program status None"],
    [{ request_id: undefined }, "'request_id'"],
    [{ queue_ms: undefined }, "'queue_ms'"],
    [{ lease_held_ms: undefined }, "'lease_held_ms'"],
    [{ stdout: undefined }, "'stdout'"],
    [{ request_id: '""' }, "request_id must be a non-empty string"],
    [{ request_id: "5" }, "request_id must be a non-empty string"],
    [{ queue_ms: '"1"' }, "the reported timings must be finite numbers"],
    [{ elapsed_ms: "true" }, "the reported timings must be finite numbers"],
    [{ lease_wait_ms: "1e400" }, "the reported timings must be finite numbers"],
    [{ stderr: "5" }, "stdout and stderr must be strings"],
    [{ stdout_truncated: '"no"' }, "output truncation flags must be booleans"],
    [{ gpu_ids: "[0]" }, "gpu_ids and gpu_count must be reported together"],
    [{ gpu_count: "1" }, "gpu_ids and gpu_count must be reported together"],
    [{ gpu_ids: "[-1]", gpu_count: "1" }, "gpu_ids must be a list of device indices"],
    [{ gpu_ids: "[true]", gpu_count: "1" }, "gpu_ids must be a list of device indices"],
    [{ gpu_ids: "[1.0]", gpu_count: "1" }, "gpu_ids must be a list of device indices"],
    [{ gpu_ids: '"0"', gpu_count: "1" }, "gpu_ids must be a list of device indices"],
    [{ gpu_ids: "[0,0]", gpu_count: "2" }, "gpu_ids must contain at most eight distinct devices"],
    [
      { gpu_ids: "[0,1,2,3,4,5,6,7,8]", gpu_count: "9" },
      "gpu_ids must contain at most eight distinct devices",
    ],
    [{ gpu_ids: "[0,1]", gpu_count: "1" }, "gpu_count must match gpu_ids"],
    [{ gpu_ids: "[]", gpu_count: "0" }, "gpu_count must match gpu_ids"],
    [{ gpu_ids: "[0]", gpu_count: "true" }, "gpu_count must match gpu_ids"],
    [{ results: undefined }, "'results'"],
    [{ results: "[]" }, "results must be an object"],
    [{ error: "null" }, "COMPLETED response must not contain error details"],
    [{ status: '"FAILED"' }, "'error'"],
    [{ status: '"FAILED"', error: "[]" }, "error must be an object"],
    [
      { status: '"FAILED"', error: error.replace('"traceback":"T"', '"traceback":"T","x":1') },
      "error details have unexpected fields",
    ],
    [
      { status: '"FAILED"', error: error.replace(',"traceback":"T"', "") },
      "error details have unexpected fields",
    ],
    [
      { status: '"FAILED"', error: error.replace('"engine"', '"gpu_access"') },
      "error details have unexpected fields",
    ],
    [
      { status: '"FAILED"', error: error.replace('"engine"', '"runtime_error"') },
      "error kind is invalid",
    ],
    [
      { status: '"FAILED"', error: gpuError.replace('"cuMemAlloc"', "5") },
      "gpu_access error details have the wrong types",
    ],
    [
      { status: '"FAILED"', error: error.replace('"T"', "null") },
      "error message and traceback must be strings",
    ],
    [{
      status: '"FAILED"',
      error: error.replace('"instruction_index":3', '"instruction_index":3.0'),
    }, "error instruction_index must be an integer"],
    [{
      status: '"FAILED"',
      error: error.replace('"instruction_index":3', '"instruction_index":true'),
    }, "error instruction_index must be an integer"],
    [
      { status: '"FAILED"', error: error.replace('"run",', '"call",') },
      "error instruction_op is invalid",
    ],
    [
      { status: '"FAILED"', error: error.replace('"run_3"', "3") },
      "error instruction_id must be a string or null",
    ],
  ];
  for (const [changes, detail] of cases) malformed(body(changes), [], detail);
  const failed = decode(body({ status: '"FAILED"', error, gpu_ids: "[2,0]", gpu_count: "2" }));
  assert.deepEqual(failed.error, {
    kind: "engine",
    message: "ValueError: bad",
    instructionIndex: 3,
    instructionOp: "run",
    instructionId: "run_3",
    traceback: "T",
  });
  assert.deepEqual(failed.gpuIds, [2, 0]);
  const gpu = decode(body({ status: '"FAILED"', error: gpuError }));
  assert.equal(gpu.error?.cudaCall, "cuMemAlloc");
  assert.equal(gpu.error?.interferedRequestId, null);
  malformed(body(), [new Uint8Array([1])], "unreferenced binary response parts: ['return:0']");
});

Deno.test("response: every value check of upstream's client (spec §3.2)", () => {
  const one = [7];
  const h = sha256Hex(new Uint8Array(one));
  const part = [new Uint8Array(one)];
  const cases: [string, Uint8Array[], string][] = [
    ["5", [], "encoded values must be objects with a type"],
    ['{"type":5}', [], "encoded values must be objects with a type"],
    [
      '{"type":"null","value":null}',
      [],
      "encoded 'null' value has fields ['type', 'value'], expected ['type']",
    ],
    [
      '{"type":"integer"}',
      [],
      "encoded 'integer' value has fields ['type'], expected ['type', 'value']",
    ],
    ['{"type":"boolean","value":1}', [], "boolean value has the wrong type"],
    ['{"type":"integer","value":1.0}', [], "integer value has the wrong type"],
    ['{"type":"integer","value":false}', [], "integer value has the wrong type"],
    ['{"type":"number","value":"1"}', [], "number value has the wrong type"],
    ['{"type":"number","value":true}', [], "number value has the wrong type"],
    ['{"type":"string","value":5}', [], "string value has the wrong type"],
    ['{"type":"array","value":{}}', [], "array value has the wrong type"],
    ['{"type":"object","value":[]}', [], "object value has the wrong type"],
    ['{"type":"set","value":[]}', [], "unknown encoded value type: 'set'"],
    [`{"type":"bytes","part":5,"sha256":"${h}"}`, part, "binary value has an invalid part name"],
    [
      `{"type":"bytes","part":"part:0","sha256":"${h}"}`,
      part,
      "binary value has an invalid part name",
    ],
    [
      `{"type":"bytes","part":"return:00","sha256":"${h}"}`,
      part,
      "binary value has an invalid part index",
    ],
    [
      `{"type":"bytes","part":"return:x","sha256":"${h}"}`,
      part,
      "binary value has an invalid part index",
    ],
    [
      `{"type":"bytes","part":"return:1","sha256":"${h}"}`,
      part,
      "binary values are not numbered in depth-first order",
    ],
    [
      `{"type":"bytes","part":"return:0","sha256":"${h.toUpperCase()}"}`,
      part,
      "binary value has an invalid SHA-256 digest",
    ],
    [
      `{"type":"bytes","part":"return:0","sha256":"${h}"}`,
      [],
      "missing binary response part: 'return:0'",
    ],
    [
      `{"type":"bytes","part":"return:0","sha256":"${"0".repeat(64)}"}`,
      part,
      `blob hash mismatch: declared ${"0".repeat(64)}, computed ${h}`,
    ],
    [
      `{"type":"bytes","part":"return:0","sha256":"${h}","size":1}`,
      part,
      "encoded 'bytes' value has fields ['part', 'sha256', 'size', 'type'], expected ['part', 'sha256', 'type']",
    ],
    [binary(one, 0, "file", ',"size":-1'), part, "file size must be a non-negative integer"],
    [binary(one, 0, "file", ',"size":1.0'), part, "file size must be a non-negative integer"],
    [binary(one, 0, "file", ',"size":true'), part, "file size must be a non-negative integer"],
    [binary(one, 0, "file", ',"size":2'), part, "file binary length does not match size"],
    [binary(one, 0, "tensor", ',"dtype":"uint16","shape":[1]'), part, "tensor metadata is invalid"],
    [binary(one, 0, "tensor", ',"dtype":"uint8","shape":[-1]'), part, "tensor metadata is invalid"],
    [
      binary(one, 0, "tensor", ',"dtype":"uint8","shape":[1.0]'),
      part,
      "tensor metadata is invalid",
    ],
    [
      // No elements, but a dimension no array here can have (beyond 2^53).
      binary([], 0, "tensor", ',"dtype":"uint8","shape":[0,1180591620717411303424]'),
      [new Uint8Array(0)],
      "tensor metadata is invalid",
    ],
    [
      binary(one, 0, "tensor", ',"dtype":"float32","shape":[1]'),
      part,
      "tensor binary length does not match dtype and shape",
    ],
    [
      '{"type":"folder","files":[],"directories":[]}',
      [],
      "folder files/directories have the wrong type",
    ],
    [
      '{"type":"folder","files":{"./a":{}},"directories":[]}',
      [],
      "folder paths must be canonical relative POSIX paths",
    ],
    [
      '{"type":"folder","files":{"../a":{}},"directories":[]}',
      [],
      "filesystem 'path' must not contain a '..' component",
    ],
    [
      '{"type":"folder","files":{},"directories":[5]}',
      [],
      "filesystem 'path' must be a non-empty string",
    ],
    [
      '{"type":"folder","files":{"b":{},"a":{}},"directories":[]}',
      [],
      "folder entries must be sorted",
    ],
    ['{"type":"folder","files":{},"directories":["b","a"]}', [], "folder entries must be sorted"],
    [
      '{"type":"folder","files":{"a":{}},"directories":["a"]}',
      [],
      "folder contains duplicate or conflicting paths",
    ],
    [
      '{"type":"folder","files":{"a/b":{}},"directories":[]}',
      [],
      "folder entry has a missing or conflicting parent: 'a/b'",
    ],
    [
      '{"type":"folder","files":{"a":{"type":"bytes"}},"directories":[]}',
      [],
      "folder files must contain file values",
    ],
  ];
  for (const [value, parts, detail] of cases) {
    malformed(body({ results: `{"k":${value}}` }), parts, detail);
  }
  assert.deepEqual(
    decode(
      body({ results: `{"k":${binary(one, 0, "tensor", ',"dtype":"uint8","shape":[1,1]')}}` }),
      part,
    ).results.get("k"),
    {
      tensor: ["uint8", [1, 1], [7]],
    },
  );
});

Deno.test("response: content types and multipart structure (spec §3.3)", () => {
  const result = enc.encode(body());
  const multipart = (parts: MultipartInput[]) => encodeMultipart(parts);
  const cases: [string | null, Uint8Array, string][] = [
    [null, result, "unsupported response content type: ''"],
    ["text/html; charset=utf-8", result, "unsupported response content type: 'text/html'"],
    [
      "application/json",
      enc.encode("<html>"),
      "response is not valid JSON: malformed JSON: Expecting value: line 1 column 1 (char 0)",
    ],
    [
      "application/json",
      enc.encode('{"a":1,"a":2}'),
      "response is not valid JSON: duplicate JSON key: 'a'",
    ],
    ["application/json", enc.encode("[]"), "JSON response must be an object"],
    [
      "multipart/form-data",
      result,
      "malformed multipart response: malformed multipart/form-data boundary",
    ],
    [
      "multipart/form-data; boundary=B",
      enc.encode("--B--"),
      "malformed multipart response: multipart body has no parts",
    ],
  ];
  const resultPart = { name: "result", contentType: "application/json", body: result };
  const dataPart = {
    name: "return:0",
    contentType: "application/octet-stream",
    body: new Uint8Array(1),
  };
  const multi: [MultipartInput[], string][] = [
    [[resultPart, resultPart], "duplicate 'result' response part"],
    [
      [{ ...resultPart, contentType: "text/plain" }],
      "the 'result' response part must use application/json",
    ],
    [
      [{ ...resultPart, body: enc.encode("{") }],
      "the 'result' part is not valid JSON: malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ],
    [
      [{ ...resultPart, body: enc.encode("1") }],
      "the 'result' response part must contain an object",
    ],
    [[resultPart, dataPart, dataPart], "duplicate response part: 'return:0'"],
    [
      [resultPart, { ...dataPart, contentType: "application/json" }],
      "response part 'return:0' has the wrong content type",
    ],
    [[dataPart], "multipart response is missing the 'result' part"],
  ];
  for (const [parts, message] of multi) {
    const encoded = multipart(parts);
    cases.push([encoded.contentType, encoded.body, message]);
  }
  for (const [contentType, bytes, message] of cases) {
    assert.throws(() => decodeResponseBody(contentType, bytes), (error: unknown) => {
      assert.ok(error instanceof ResponseError);
      assert.equal(error.message, message);
      return true;
    });
  }
  const ok = decodeResponseBody("Application/JSON ; charset=utf-8", result);
  assert.equal(ok.body.get("status"), "COMPLETED");
});

Deno.test("response: CACHE_MISS lists and non-200 bodies", () => {
  const miss = (text: string) => decodeMissingBlobs(parseJsonTyped(text) as TypedJsonObject);
  const h = "a".repeat(64);
  assert.deepEqual(miss(`{"missing_blobs":["${h}"]}`), [h]);
  assert.throws(
    () => miss("{}"),
    /^ResponseError: CACHE_MISS response needs a non-empty 'missing_blobs' array$/,
  );
  assert.throws(() => miss('{"missing_blobs":[]}'), /needs a non-empty 'missing_blobs' array/);
  assert.throws(() => miss('{"missing_blobs":["abc"]}'), /contains an invalid blob hash/);
  assert.throws(() => miss(`{"missing_blobs":["${h}","${h}"]}`), /contains duplicate blob hashes/);
  const error = (status: number, text: string) => decodeServerError(status, enc.encode(text));
  assert.deepEqual(error(503, errorBody("r", "busy", "server saturated")), {
    message: "server saturated",
    kind: "busy",
    requestId: "r",
  });
  assert.deepEqual(error(500, "Internal Server Error"), {
    message: "HTTP 500",
    kind: null,
    requestId: null,
  });
  assert.deepEqual(error(404, '{"detail":"Not Found"}'), {
    message: "HTTP 404",
    kind: null,
    requestId: null,
  });
  assert.deepEqual(error(400, '{"error":"bad thing"}'), {
    message: "bad thing",
    kind: null,
    requestId: null,
  });
  assert.deepEqual(error(400, '{"error":[1,"a"]}'), {
    message: "[1, 'a']",
    kind: null,
    requestId: null,
  });
  assert.deepEqual(error(400, '{"error":{"kind":5}}'), {
    message: "server error",
    kind: null,
    requestId: null,
  });
  assert.deepEqual(error(400, '{"error":{"message":7}}'), {
    message: "7",
    kind: null,
    requestId: null,
  });
});

Deno.test("response_encode: resultJson", () => {
  const text = resultJson({
    status: "COMPLETED",
    requestId: "r",
    queueMs: 0,
    elapsedMs: 1.5,
    leaseWaitMs: 0,
    leaseHeldMs: 1,
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    resultsJson: "{}",
  });
  if (!text.startsWith('{"status":"COMPLETED","request_id":"r","queue_ms":0.0,"elapsed_ms":1.5,')) {
    throw new Error(text);
  }
});

Deno.test("response_encode: cacheMissJson", () => {
  if (
    cacheMissJson("r", ["ab"]) !== '{"status":"CACHE_MISS","request_id":"r","missing_blobs":["ab"]}'
  ) {
    throw new Error();
  }
});

Deno.test("response_encode: encodeExecuteResponse", () => {
  const plain = encodeExecuteResponse('{"status":"CACHE_MISS"}', []);
  if (plain.contentType !== "application/json") throw new Error();
  const multi = encodeExecuteResponse("{}", [new Uint8Array([1])]);
  if (!multi.contentType.startsWith("multipart/form-data; boundary=kcoral-")) throw new Error();
});

Deno.test("response_decode: ResponseError", () => {
  try {
    decodeJsonObject(new TextEncoder().encode("[]"));
    throw new Error("expected a ResponseError");
  } catch (error) {
    if (!(error instanceof ResponseError)) throw error;
  }
});

Deno.test("response_decode: ResponseBody", () => {
  const decoded: ResponseBody = decodeResponseBody(
    "application/json",
    new TextEncoder().encode("{}"),
  );
  if (decoded.body.size !== 0 || decoded.parts.size !== 0) throw new Error();
});

Deno.test("response_decode: decodeJsonObject", () => {
  if (decodeJsonObject(new TextEncoder().encode('{"status":"ok"}')).get("status") !== "ok") {
    throw new Error();
  }
});

Deno.test("response_decode: decodeResponseBody", () => {
  const { body, parts } = decodeResponseBody(
    "application/json",
    new TextEncoder().encode('{"a":1}'),
  );
  if (body.get("a") !== 1 || parts.size !== 0) throw new Error();
});

Deno.test("response_decode: decodeMissingBlobs", () => {
  const hash = "a".repeat(64);
  if (decodeMissingBlobs(new Map([["missing_blobs", [hash]]]))[0] !== hash) throw new Error();
});

Deno.test("response_decode: decodeProgramResult", () => {
  const body = parseJsonTyped(
    '{"status":"COMPLETED","request_id":"r","queue_ms":0,"elapsed_ms":1.0,"lease_wait_ms":0.0,' +
      '"lease_held_ms":0.5,"stdout":"","stderr":"","results":{"n":{"type":"integer","value":6}}}',
  ) as Map<string, never>;
  const factories = { tensor: () => 0, bytes: () => 0, file: () => 0, folder: () => 0 };
  const result = decodeProgramResult(body, new Map(), factories);
  if (result.results.get("n") !== 6 || result.stdoutTruncated) throw new Error();
});

Deno.test("result_fields: ResultFields", () => {
  const fields: ResultFields = {
    status: "FAILED",
    requestId: "r",
    queueMs: 0,
    elapsedMs: 1,
    leaseWaitMs: 0,
    leaseHeldMs: 0,
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    resultsJson: "{}",
    errorJson: '{"kind":"runtime"}',
  };
  if (!resultJson(fields).endsWith(',"results":{},"error":{"kind":"runtime"}}')) throw new Error();
});

Deno.test("result_fields: ERROR_FIELDS", () => {
  if (ERROR_FIELDS[0] !== "kind" || ERROR_FIELDS.at(-1) !== "traceback") throw new Error();
});

Deno.test("result_fields: GPU_ACCESS_FIELDS", () => {
  if (!GPU_ACCESS_FIELDS.includes("interfered_request_id")) throw new Error();
});
