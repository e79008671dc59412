import assert from "node:assert/strict";
import {
  Client,
  Program,
  ProgramResult,
  ReturnedFile,
  ReturnedFolder,
  Tensor,
  ValidationError,
} from "../mod.ts";
import { encodeExecuteResponse, sha256Hex } from "../protocol/mod.ts";
import { completed, fakeServer } from "./fixtures/protocol/fake_server.ts";

const enc = new TextEncoder();

Deno.test("Tensor.fromBytes: a typed array where one exists, raw bytes otherwise", () => {
  const cases: [Parameters<typeof Tensor.fromBytes>[0], number[], ArrayBufferView, unknown][] = [
    ["float32", [2], new Float32Array([1.5, -2]), Float32Array],
    ["float64", [1], new Float64Array([Math.PI]), Float64Array],
    ["float16", [2], new Float16Array([0.5, 2]), Float16Array],
    ["int8", [2], new Int8Array([-1, 5]), Int8Array],
    ["int16", [1, 1], new Int16Array([-300]), Int16Array],
    ["int32", [1], new Int32Array([-70000]), Int32Array],
    ["int64", [1], new BigInt64Array([-(2n ** 60n)]), BigInt64Array],
    ["uint8", [2], new Uint8Array([0, 255]), Uint8Array],
    ["bool", [2], new Uint8Array([1, 0]), Uint8Array],
    ["bfloat16", [1], new Uint8Array([0x80, 0x3f]), Uint8Array],
    ["float8_e4m3fn", [2], new Uint8Array([1, 2]), Uint8Array],
    ["float8_e5m2", [0], new Uint8Array(0), Uint8Array],
  ];
  for (const [dtype, shape, values, type] of cases) {
    const raw = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
    // Place the bytes at an odd offset: the decoder must copy to align.
    const padded = new Uint8Array(raw.length + 1);
    padded.set(raw, 1);
    const tensor = Tensor.fromBytes(dtype, shape, padded.subarray(1));
    assert.ok(tensor.data instanceof (type as typeof Uint8Array), dtype);
    assert.deepEqual([...tensor.data as Uint8Array], [...values as Uint8Array], dtype);
    assert.deepEqual(tensor.shape, shape);
    assert.deepEqual(tensor.bytes(), raw);
  }
  // Aligned bytes are viewed, not copied.
  const aligned = new Uint8Array(new Float32Array([7]).buffer);
  assert.equal(Tensor.fromBytes("float32", [1], aligned).data.buffer, aligned.buffer);
  assert.throws(() => new Tensor("float32", [3], new Float32Array(2)), ValidationError);
  assert.throws(() => new Tensor("float32", [2], new Int32Array(2)), TypeError);
  assert.throws(() => new Tensor("uint16" as "uint8", [2], new Uint8Array(2)), ValidationError);
});

Deno.test("ReturnedFile.save: exclusive by default, atomic overwrite, no staging left", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = new ReturnedFile(enc.encode("one"));
    assert.equal(await file.save(`${dir}/a.txt`), `${dir}/a.txt`);
    assert.equal(await Deno.readTextFile(`${dir}/a.txt`), "one");
    assert.equal((await Deno.stat(`${dir}/a.txt`)).mode! & 0o777, 0o600);
    await assert.rejects(
      new ReturnedFile(enc.encode("two")).save(`${dir}/a.txt`),
      (error: unknown) =>
        error instanceof Deno.errors.AlreadyExists &&
        error.message === "save destination already exists: 'a.txt'",
    );
    assert.equal(await Deno.readTextFile(`${dir}/a.txt`), "one");
    await new ReturnedFile(enc.encode("two")).save(`${dir}/a.txt`, { overwrite: true });
    assert.equal(await Deno.readTextFile(`${dir}/a.txt`), "two");
    await Deno.mkdir(`${dir}/sub`);
    await assert.rejects(
      file.save(`${dir}/sub`, { overwrite: true }),
      (error: unknown) =>
        error instanceof ValidationError &&
        error.message === "overwrite requires a regular file destination",
    );
    // A symbolic link at the destination is not a regular file: never followed or replaced.
    await Deno.symlink(`${dir}/a.txt`, `${dir}/link`);
    await assert.rejects(file.save(`${dir}/link`), Deno.errors.AlreadyExists);
    await assert.rejects(file.save(`${dir}/link`, { overwrite: true }), ValidationError);
    assert.equal(await Deno.readTextFile(`${dir}/a.txt`), "two");
    // Parents: must exist, no links, no '..'.
    await Deno.symlink(`${dir}/sub`, `${dir}/sublink`);
    await assert.rejects(file.save(`${dir}/sublink/x.txt`), Deno.errors.FilesystemLoop);
    await assert.rejects(file.save(`${dir}/missing/x.txt`), Deno.errors.NotFound);
    await assert.rejects(file.save(`${dir}/a.txt/x`), Deno.errors.NotADirectory);
    await assert.rejects(
      file.save(`${dir}/sub/../b.txt`),
      (error: unknown) =>
        error instanceof ValidationError &&
        error.message === "save destination must name a file or folder without '..'",
    );
    await assert.rejects(file.save("."), ValidationError);
    await assert.rejects(file.save("/"), ValidationError);
    await file.save(new URL(`file://${dir}/sub/./url.txt`));
    assert.deepEqual((await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort(), [
      "a.txt",
      "link",
      "sub",
      "sublink",
    ]);
    assert.equal(file.text(), "one");
    assert.equal(file.size, 3);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("ReturnedFolder: manifest checked; save creates a new tree, or nothing", async () => {
  const f = (text: string) => new ReturnedFile(enc.encode(text));
  assert.throws(
    () => new ReturnedFolder(new Map([["b", f("")], ["a", f("")]])),
    /folder entries must be sorted/,
  );
  assert.throws(() => new ReturnedFolder(new Map([["a/b", f("")]])), ValidationError);
  assert.throws(
    () => new ReturnedFolder(new Map([["a", "x" as unknown as ReturnedFile]])),
    TypeError,
  );
  const dir = await Deno.makeTempDir();
  try {
    const folder = new ReturnedFolder(
      new Map([[".h", f("h")], ["10.txt", f("10")], ["9.txt", f("9")], ["a/x", f("x")]]).entries(),
      ["a", "a/empty"],
    );
    assert.deepEqual([...folder.files.keys()], [".h", "10.txt", "9.txt", "a/x"]);
    await folder.save(`${dir}/out`);
    assert.equal(await Deno.readTextFile(`${dir}/out/a/x`), "x");
    assert.equal(await Deno.readTextFile(`${dir}/out/.h`), "h");
    assert.ok((await Deno.stat(`${dir}/out/a/empty`)).isDirectory);
    assert.equal((await Deno.stat(`${dir}/out`)).mode! & 0o777, 0o700);
    assert.equal((await Deno.stat(`${dir}/out/a/x`)).mode! & 0o777, 0o600);
    await assert.rejects(folder.save(`${dir}/out`), Deno.errors.AlreadyExists);
    // Any failure removes the partial tree.
    class Exploding extends ReturnedFile {
      override bytes(): Uint8Array {
        throw new Error("boom");
      }
    }
    const broken = new ReturnedFolder(
      new Map([["a/ok", f("ok")], ["z", new Exploding(enc.encode("z"))]]),
      ["a"],
    );
    await assert.rejects(broken.save(`${dir}/partial`), /boom/);
    await assert.rejects(Deno.lstat(`${dir}/partial`), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("client: a returned folder with sorted keys round-trips to disk", async () => {
  const files: [string, string][] = [["10.txt", "ten"], ["9.txt", "nine"], ["a/x", ""], [
    "a/y/z",
    "z",
  ]];
  const nodes = files.map(([path, text], i) => {
    const data = enc.encode(text);
    return `${JSON.stringify(path)}:{"type":"file","part":"return:${i + 1}","sha256":"${
      sha256Hex(data)
    }","size":${data.length}}`;
  });
  const loose = enc.encode("loose");
  const results =
    `{"single":{"type":"file","part":"return:0","sha256":"${sha256Hex(loose)}","size":5},` +
    `"tree":{"type":"folder","files":{${nodes.join(",")}},"directories":["a","a/empty","a/y"]},` +
    `"raw":{"type":"bytes","part":"return:5","sha256":"${sha256Hex(new Uint8Array([9]))}"}}`;
  const server = fakeServer(() => {
    const encoded = encodeExecuteResponse(completed("r", results), [
      loose,
      ...files.map(([, text]) => enc.encode(text)),
      new Uint8Array([9]),
    ]);
    return new Response(encoded.body, { headers: { "content-type": encoded.contentType } });
  });
  const dir = await Deno.makeTempDir();
  try {
    await using client = new Client(server.url);
    const program = new Program();
    program.returnFolder({ key: "tree", path: "out" });
    const result = await client.execute(program);
    const tree = result.get<ReturnedFolder>("tree");
    assert.ok(tree instanceof ReturnedFolder);
    assert.deepEqual([...tree.files.keys()], files.map(([path]) => path));
    assert.deepEqual(tree.directories, ["a", "a/empty", "a/y"]);
    assert.equal(result.get<ReturnedFile>("single").text(), "loose");
    assert.deepEqual(result.get("raw"), new Uint8Array([9]));
    await tree.save(`${dir}/tree`);
    for (const [path, text] of files) {
      assert.equal(await Deno.readTextFile(`${dir}/tree/${path}`), text);
    }
    const entries = (await Array.fromAsync(Deno.readDir(`${dir}/tree`))).map((e) => e.name).sort();
    assert.deepEqual(entries, ["10.txt", "9.txt", "a"]);
  } finally {
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("ProgramResult: accessors", () => {
  const result = new ProgramResult({
    status: "FAILED",
    requestId: "r",
    queueMs: 1,
    elapsedMs: 2,
    leaseWaitMs: 0,
    leaseHeldMs: 1,
    results: new Map([["early", 1]]),
    stdout: "o",
    stderr: "e",
    stdoutTruncated: true,
    stderrTruncated: false,
    error: {
      kind: "engine",
      message: "ValueError: bad",
      instructionIndex: 3,
      instructionOp: "run",
      instructionId: "run_3",
      traceback: "",
    },
    gpuIds: [1],
  });
  assert.equal(result.completed, false);
  assert.equal(result.get("early"), 1);
  assert.equal(result.has("late"), false);
  assert.throws(() => result.get("late"), RangeError);
  assert.deepEqual(result.gpuIds, [1]);
});
