import assert from "node:assert/strict";
import {
  encodeMultipart,
  type MultipartInput,
  parseExecuteRequest,
  parseProgram,
  RequestParseError,
  sha256Hex,
  tensorLengthError,
  unreferencedBlobsError,
} from "./mod.ts";

const enc = new TextEncoder();

// Spec §10: the float32 tensor [1, 2, 3, 4] and its hash.
const TENSOR = new Uint8Array([
  0,
  0,
  0x80,
  0x3f,
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
]);
const TENSOR_HASH = "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1";
const PROGRAM =
  '{"instructions":[{"op":"upload","kind":"module","source":"def add_one(x):\\n    return x + 1\\n","id":"upload_0"},{"op":"get_function","id":"get_function_1","module":{"$ref":"upload_0"},"name":"add_one"},{"op":"upload","kind":"tensor","blob":"ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1","dtype":"float32","shape":[4],"id":"upload_2"},{"op":"run","id":"run_3","fn":{"$ref":"get_function_1"},"args":[{"$ref":"upload_2"}]},{"op":"return","key":"y","value":{"$ref":"run_3"}}],"options":{"timeout_seconds":30}}';

function program(text = PROGRAM, contentType = "application/json"): MultipartInput {
  return { name: "program", contentType, body: enc.encode(text) };
}

function blob(
  data: Uint8Array,
  name = `blob:${sha256Hex(data)}`,
  contentType = "application/octet-stream",
): MultipartInput {
  return { name, contentType, body: data };
}

function parse(parts: MultipartInput[]) {
  const encoded = encodeMultipart(parts);
  return parseExecuteRequest(encoded.body, encoded.contentType);
}

function rejects(parts: MultipartInput[], message: string): void {
  assert.throws(() => parse(parts), (error: unknown) => {
    assert.ok(error instanceof RequestParseError, String(error));
    assert.equal(error.message, message);
    return true;
  });
}

Deno.test("request: the spec §10 attempt 2, byte for byte as the spec shows it", () => {
  const head = "--4f2c9e0d8b7a6c5e3f1a2b3c4d5e6f70\r\n";
  const body = new Uint8Array([
    ...enc.encode(
      head +
        'Content-Disposition: form-data; name="program"\r\nContent-Type: application/json\r\n\r\n' +
        PROGRAM + "\r\n" + head +
        `Content-Disposition: form-data; name="blob:${TENSOR_HASH}"\r\nContent-Type: application/octet-stream\r\n\r\n`,
    ),
    ...TENSOR,
    ...enc.encode("\r\n--4f2c9e0d8b7a6c5e3f1a2b3c4d5e6f70--\r\n"),
  ]);
  assert.equal(sha256Hex(TENSOR), TENSOR_HASH);
  const request = parseExecuteRequest(
    body,
    "multipart/form-data; boundary=4f2c9e0d8b7a6c5e3f1a2b3c4d5e6f70",
  );
  assert.equal(new TextDecoder().decode(request.programText), PROGRAM);
  assert.deepEqual([...request.blobs.keys()], [TENSOR_HASH]);
  assert.deepEqual(request.blobs.get(TENSOR_HASH), TENSOR);
  assert.equal(request.blobs.get(TENSOR_HASH)!.buffer, body.buffer); // a view, not a copy
  assert.equal(request.program.blobs[0].tensorByteLengths[0], 16);
  assert.equal(request.program.options.timeoutSeconds, 30);
});

Deno.test("request: part checks with upstream's messages (spec §2.2)", () => {
  const other = new Uint8Array([1, 2, 3]);
  const otherHash = sha256Hex(other);
  rejects([program(), program()], "duplicate multipart part: 'program'");
  rejects([program(PROGRAM, "text/plain")], "the 'program' part must use application/json");
  rejects(
    [program(), { name: "file", contentType: "text/plain", body: other }],
    "unsupported multipart part: 'file'",
  );
  rejects(
    [program(), blob(other, `blob:${otherHash.toUpperCase()}`)],
    `malformed blob part name: 'blob:${otherHash.toUpperCase()}'`,
  );
  rejects([program(), blob(other, "blob:abc")], "malformed blob part name: 'blob:abc'");
  rejects([program(), blob(other), blob(other)], `duplicate blob part: ${otherHash}`);
  rejects(
    [program(), blob(other, undefined, "application/json")],
    `blob part ${otherHash} must use application/octet-stream`,
  );
  rejects(
    [program(), blob(other, `blob:${TENSOR_HASH}`)],
    `blob hash mismatch: declared ${TENSOR_HASH}, computed ${otherHash}`,
  );
  rejects([blob(other)], "missing multipart part: 'program'");
});

Deno.test("request: upstream's order: framing, parts, missing program, JSON, schema", () => {
  assert.throws(
    () => parseExecuteRequest(enc.encode("{}"), "application/json"),
    /^RequestParseError: expected a multipart\/form-data request$/,
  );
  assert.throws(
    () => parseExecuteRequest(enc.encode("--B--\r\n"), "multipart/form-data; boundary=B"),
    /^RequestParseError: multipart body has no parts$/,
  );
  // Blob parts are verified before the program is parsed, whatever the part order.
  rejects(
    [program("not json"), blob(new Uint8Array([9]), `blob:${TENSOR_HASH}`)],
    `blob hash mismatch: declared ${TENSOR_HASH}, computed ${sha256Hex(new Uint8Array([9]))}`,
  );
  rejects([program("not json")], "malformed JSON: Expecting value: line 1 column 1 (char 0)");
  rejects([program('{"instructions":[]}')], "'instructions' must be a non-empty array");
  // Unreferenced blobs are the server's later check, not a parse error.
  const request = parse([
    program(PROGRAM, "application/json; charset=utf-8"),
    blob(TENSOR),
    blob(new Uint8Array(0)),
  ]);
  assert.equal(request.blobs.size, 2);
});

Deno.test("request: the server's next checks: unreferenced blobs, tensor lengths (spec §2.8)", () => {
  const [a, b, c] = ["a", "b", "c"].map((x) => x.repeat(64));
  const program = parseProgram(JSON.stringify({
    instructions: [
      { op: "upload", kind: "bytes", blob: a, id: "raw" },
      { op: "upload", kind: "tensor", blob: b, dtype: "int16", shape: [3], id: "t1" },
      { op: "upload", kind: "tensor", blob: a, dtype: "int64", shape: [2], id: "it's" },
      {
        op: "upload",
        kind: "tensor",
        blob: c,
        dtype: "uint8",
        shape: [4294967296, 4294967296],
        id: "big",
      },
    ],
  }));
  assert.equal(unreferencedBlobsError(program, [a, b]), undefined);
  assert.equal(
    unreferencedBlobsError(program, ["f".repeat(64), a, "e".repeat(64)]),
    `unreferenced blob part(s): ${"e".repeat(64)}, ${"f".repeat(64)}`,
  );
  const lengths = new Map([[a, 16], [b, 6], [c, 1]]);
  assert.equal(
    tensorLengthError(program, (hash) => hash === c ? undefined : lengths.get(hash)),
    undefined,
  );
  assert.equal(
    tensorLengthError(program, (hash) => lengths.get(hash)),
    "tensor upload 'big' expects 18446744073709551616 bytes, got 1",
  );
  lengths.set(a, 8);
  assert.equal(
    tensorLengthError(program, (hash) => lengths.get(hash)),
    `tensor upload "it's" expects 16 bytes, got 8`,
  );
  lengths.set(b, 5);
  assert.equal(
    tensorLengthError(program, (hash) => lengths.get(hash)),
    "tensor upload 't1' expects 6 bytes, got 5",
  );
});

Deno.test("request: digests known in advance are used for exactly their parts", () => {
  const { contentType, body } = encodeMultipart([program(), blob(TENSOR)]);
  const wrong = "f".repeat(64);
  const seen: Uint8Array[] = [];
  // A known digest stands in for hashing: a wrong one is reported like a real mismatch.
  assert.throws(
    () =>
      parseExecuteRequest(body, contentType, {
        knownDigest: (part) => (seen.push(part), wrong),
      }),
    (error: unknown) =>
      error instanceof RequestParseError &&
      error.message === `blob hash mismatch: declared ${TENSOR_HASH}, computed ${wrong}`,
  );
  assert.deepEqual(seen, [TENSOR]); // asked only for the blob part
  // An unknown part is hashed here.
  const request = parseExecuteRequest(body, contentType, { knownDigest: () => undefined });
  assert.deepEqual([...request.blobs.keys()], [TENSOR_HASH]);
});

Deno.test("request: parseExecuteRequest", () => {
  const program = '{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}]}';
  const { contentType, body } = encodeMultipart([
    { name: "program", contentType: "application/json", body: new TextEncoder().encode(program) },
  ]);
  const request = parseExecuteRequest(body, contentType);
  if (request.program.instructionCount !== 1 || request.blobs.size !== 0) throw new Error();
});

Deno.test("request: unreferencedBlobsError", () => {
  const program = parseProgram(
    '{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}]}',
  );
  const message = unreferencedBlobsError(program, ["b".repeat(64), "a".repeat(64)]);
  if (message !== `unreferenced blob part(s): ${"a".repeat(64)}, ${"b".repeat(64)}`) {
    throw new Error();
  }
});

Deno.test("request: tensorLengthError", () => {
  const hash = "a".repeat(64);
  const program = parseProgram(
    `{"instructions":[{"op":"upload","kind":"tensor","blob":"${hash}","dtype":"float32","shape":[4],"id":"x"}]}`,
  );
  if (tensorLengthError(program, () => 12) !== "tensor upload 'x' expects 16 bytes, got 12") {
    throw new Error();
  }
  if (tensorLengthError(program, () => undefined) !== undefined) throw new Error();
});

Deno.test("mod: @module (Parse a request the way the server does)", () => {
  const blob = new Uint8Array([0, 0, 128, 63]);
  const hash = sha256Hex(blob);
  const program = JSON.stringify({
    instructions: [{
      op: "upload",
      kind: "tensor",
      blob: hash,
      dtype: "float32",
      shape: [1],
      id: "x",
    }],
  });
  const { contentType, body } = encodeMultipart([
    { name: "program", contentType: "application/json", body: new TextEncoder().encode(program) },
    { name: `blob:${hash}`, contentType: "application/octet-stream", body: blob },
  ]);
  const request = parseExecuteRequest(body, contentType);
  if (request.program.blobs[0].tensorByteLengths[0] !== 4) throw new Error();
});
