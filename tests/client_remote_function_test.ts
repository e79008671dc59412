import assert from "node:assert/strict";
import { outputWithInput } from "./_child.ts";
import {
  Client,
  ProtocolError,
  RemoteExecutionError,
  RemoteFunction,
  Tensor,
  ValidationError,
} from "../mod.ts";
import { sha256Hex } from "../protocol/mod.ts";
import { completed, fakeServer, json } from "./fixtures/protocol/fake_server.ts";

const SOURCE = `
# The user's module may shadow builtins; the wrapper must not depend on them.
zip = None
dict = None
def globals():
    return {}

def f(a, blob, t, ref, scale=10, *rest, **extra):
    return {"a": a * scale, "blob": list(blob), "t": t, "ref": ref, "rest": list(rest), "extra": extra}
`;

const client = new Client("http://127.0.0.1:9"); // never contacted in these tests

Deno.test("remote function: upstream's wire convention (spec §5.7)", () => {
  const fn = client.pythonFunction({ source: SOURCE, name: "f", cpuOnly: true, timeoutSeconds: 5 });
  assert.equal(fn.entry, "_kcoral_invoke_f");
  assert.ok(fn.source.startsWith(SOURCE));
  const program = fn.buildProgram(
    [3, new Uint8Array([1, 2]), new Float32Array([0.5]), { $ref: "arg_1" }],
    new Map<string, unknown>([["scale", 2], ["z", [null]]]),
  );
  const [module, get, blob, tensor, run, ret] = program.instructions;
  assert.deepEqual(module, { op: "upload", kind: "module", source: fn.source, id: "module" });
  assert.deepEqual(get, {
    op: "get_function",
    id: "function",
    module: { $ref: "module" },
    name: "_kcoral_invoke_f",
    cpu_only: true,
  });
  assert.deepEqual(blob, {
    op: "upload",
    kind: "bytes",
    blob: sha256Hex(new Uint8Array([1, 2])),
    id: "arg_1",
  });
  assert.equal(tensor.id, "arg_2");
  assert.equal(tensor.dtype, "float32");
  assert.deepEqual(ret, { op: "return", key: "output", value: { $ref: "output" } });
  assert.equal(run.id, "output");
  const text = program.toJson();
  assert.ok(
    text.includes(
      '"args":[4,["scale","z"],[true,false,false,true,true,true],{"value":3},{"$ref":"arg_1"},{"$ref":"arg_2"},' +
        '{"value":{"$ref":"arg_1"}},{"value":2},{"value":[null]}]',
    ),
    text,
  );
  // No keyword arguments: an empty names list; Tensor instances are tensor uploads.
  const plain = fn.buildProgram([new Tensor("bfloat16", [1], new Uint8Array(2))]);
  assert.ok(plain.toJson().includes('"args":[1,[],[false],{"$ref":"arg_0"}]'));
  assert.equal(plain.instructions[2].dtype, "bfloat16");
});

Deno.test("remote function: the generated wrapper really works in Python", async () => {
  const fn = new RemoteFunction(client, { source: SOURCE, name: "f" });
  const cases: [unknown[], Record<string, unknown>, unknown][] = [
    [
      [3, new Uint8Array([1, 2]), [0.5], { $ref: "x" }],
      { scale: 2, k: "v" },
      { a: 6, blob: [1, 2], t: [0.5], ref: { $ref: "x" }, rest: [], extra: { k: "v" } },
    ],
    [
      [1, new Uint8Array([]), null, "r", 5, "more"],
      {},
      { a: 5, blob: [], t: null, ref: "r", rest: ["more"], extra: {} },
    ],
    [[2, new Uint8Array([7]), 1.5, 0], {}, {
      a: 20,
      blob: [7],
      t: 1.5,
      ref: 0,
      rest: [],
      extra: {},
    }],
  ];
  for (const [args, kwargs, expected] of cases) {
    const program = fn.buildProgram(args, kwargs);
    // Play the worker: exec the module, resolve top-level references, call the entry.
    const harness = `
import json, sys
program = json.loads(sys.stdin.read())
handles = {}
for item in program["instructions"]:
    if item["op"] == "upload" and item["kind"] == "module":
        namespace = {}
        exec(item["source"], namespace)
        handles[item["id"]] = namespace
    elif item["op"] == "upload" and item["kind"] == "bytes":
        handles[item["id"]] = bytes(json.loads(sys.argv[1])[item["blob"]])
    elif item["op"] == "get_function":
        handles[item["id"]] = handles[item["module"]["$ref"]][item["name"]]
    elif item["op"] == "run":
        args = [handles[a["$ref"]] if isinstance(a, dict) and set(a) == {"$ref"} else a for a in item["args"]]
        handles[item["id"]] = handles[item["fn"]["$ref"]](*args)
    elif item["op"] == "return":
        print(json.dumps(handles[item["value"]["$ref"]], sort_keys=True))
`;
    const blobs = Object.fromEntries([...program.blobs].map(([hash, bytes]) => [hash, [...bytes]]));
    const output = await outputWithInput(
      "python3",
      ["-c", harness, JSON.stringify(blobs)],
      program.toJson(),
    );
    assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
    assert.deepEqual(JSON.parse(new TextDecoder().decode(output.stdout)), expected);
  }
});

Deno.test("remote function: remote() returns the output or raises", async () => {
  const answers = [
    json(completed("r1", '{"output":{"type":"integer","value":5}}')),
    json(
      '{"status":"FAILED","request_id":"r2","queue_ms":0,"elapsed_ms":0,"lease_wait_ms":0,"lease_held_ms":0,' +
        '"stdout":"","stderr":"","results":{},"error":{"kind":"engine","message":"ValueError: bad",' +
        '"instruction_index":3,"instruction_op":"run","instruction_id":"output","traceback":"tb"}}',
    ),
    json(completed("r3")),
  ];
  const server = fakeServer((_request, index) => answers[index]);
  try {
    await using remote = new Client(server.url);
    const add = remote.pythonFunction({
      source: "def add(a, b=1):\n    return a + b",
      name: "add",
      timeoutSeconds: 7,
      outputLimitBytes: 64,
    });
    assert.equal(await add.remote([2], { b: 3 }), 5);
    assert.ok(
      server.received[0].programText!.endsWith(
        '"options":{"timeout_seconds":7,"output_limit_bytes":64}}',
      ),
    );
    await assert.rejects(add.remote([2]), (error: unknown) => {
      assert.ok(error instanceof RemoteExecutionError);
      assert.equal(error.message, "Remote execution r2 failed: engine: ValueError: bad");
      assert.equal(error.result.error?.traceback, "tb");
      return true;
    });
    await assert.rejects(
      add.remote([2]),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message === "remote function response is missing its output",
    );
  } finally {
    await server.close();
  }
});

Deno.test("remote function: names and arguments are checked locally", () => {
  assert.throws(() => client.pythonFunction({ source: "", name: "not-valid" }), ValidationError);
  assert.throws(() => client.pythonFunction({ source: "", name: "lambda" }), ValidationError);
  assert.throws(
    () => client.pythonFunction({ source: 5 as unknown as string, name: "f" }),
    TypeError,
  );
  const fn = client.pythonFunction({ source: "def f(*a):\n    pass\n", name: "f" });
  assert.throws(() => fn.buildProgram([undefined]), TypeError);
  assert.throws(() => fn.buildProgram([NaN]), ValidationError);
  assert.throws(() => fn.buildProgram([new Uint16Array(1)]), TypeError);
});
