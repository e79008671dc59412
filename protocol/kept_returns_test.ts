import assert from "node:assert/strict";
import {
  KEEP_RETURNS_HEADER,
  type KeptNode,
  keptReturnsMinBytes,
  parseJsonTyped,
  ResultValueError,
  ValueDecoder,
  type ValueFactories,
} from "./mod.ts";

type Node = { kept: KeptNode } | { other: string };

const plain: ValueFactories<Node> = {
  tensor: () => ({ other: "tensor" }),
  bytes: () => ({ other: "bytes" }),
  file: () => ({ other: "file" }),
  folder: () => ({ other: "folder" }),
};
const keeping: ValueFactories<Node> = { ...plain, kept: (node) => ({ kept: node }) };

const SHA = "ab".repeat(32);

function decode(json: string, factories = keeping): Node {
  return new ValueDecoder(new Map(), factories).decode(parseJsonTyped(json)) as Node;
}

Deno.test("kept node: bytes and tensors decode with their fields", () => {
  assert.deepEqual(decode(`{"type":"kept","kind":"bytes","sha256":"${SHA}","size":7}`), {
    kept: { kind: "bytes", sha256: SHA, size: 7 },
  });
  assert.deepEqual(
    decode(
      `{"type":"kept","kind":"tensor","sha256":"${SHA}","size":24,"dtype":"float32","shape":[2,3]}`,
    ),
    { kept: { kind: "tensor", sha256: SHA, size: 24, dtype: "float32", shape: [2, 3] } },
  );
});

Deno.test("kept node: refused without the factory, and when malformed", () => {
  const bytes = `{"type":"kept","kind":"bytes","sha256":"${SHA}","size":7}`;
  assert.throws(() => decode(bytes, plain), /unknown encoded value type: 'kept'/);
  const bad = [
    [`{"type":"kept","kind":"file","sha256":"${SHA}","size":7}`, /invalid kind/],
    [`{"type":"kept","kind":"bytes","sha256":"${SHA}","size":7,"part":"return:0"}`, /fields/],
    [`{"type":"kept","kind":"bytes","sha256":"AB","size":7}`, /invalid SHA-256/],
    [`{"type":"kept","kind":"bytes","sha256":"${SHA}","size":-1}`, /non-negative/],
    [`{"type":"kept","kind":"bytes","sha256":"${SHA}","size":1.5}`, /non-negative/],
    [
      `{"type":"kept","kind":"tensor","sha256":"${SHA}","size":20,"dtype":"float32","shape":[2,3]}`,
      /does not match/,
    ],
    [
      `{"type":"kept","kind":"tensor","sha256":"${SHA}","size":24,"dtype":"f32","shape":[2,3]}`,
      /metadata/,
    ],
  ] as const;
  for (const [json, message] of bad) {
    assert.throws(
      () => decode(json),
      (e: unknown) => e instanceof ResultValueError && message.test(e.message),
      json,
    );
  }
});

Deno.test("X-KCoral-Keep-Returns: a byte count, or a RangeError that names the header", () => {
  assert.equal(keptReturnsMinBytes(new Headers({ [KEEP_RETURNS_HEADER]: " 0 " })), 0);
  assert.equal(keptReturnsMinBytes(new Headers()), null);
  for (const value of ["", "-1", "1e6", "0x10", "12345678901234567", "1.0"]) {
    assert.throws(
      () => keptReturnsMinBytes(new Headers({ [KEEP_RETURNS_HEADER]: value })),
      /X-KCoral-Keep-Returns must be/,
      value,
    );
  }
});

Deno.test("kept_returns: keptReturnsMinBytes", () => {
  if (keptReturnsMinBytes(new Headers({ "X-KCoral-Keep-Returns": "1048576" })) !== 1048576) {
    throw new Error();
  }
  if (keptReturnsMinBytes(new Headers()) !== null) throw new Error();
});
