/**
 * Kept returns (docs/kept-returns.md): with `keepReturns` a program's large returns stay in the
 * server's blob cache and come back as {@linkcode KeptReturn}s, which a later program uploads
 * by reference; without it nothing changes; what the server cannot keep is sent; a dropped one
 * is a CACHE_MISS the client names; through a Router the node that kept them runs the next
 * program.
 */
import assert from "node:assert/strict";
import { Client, KeptReturn, Program, ProtocolError, type ResultValue, Tensor } from "../mod.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { callProgram, MODES, startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";

const MAKE = "def f(n, m):\n    return [bytes(range(256)) * (n // 256), b'small' * m]\n";

/** A program returning, as `out`, what `f` of module `source` returns for `args`. */
function calling(source: string, args: readonly unknown[] = [], p = new Program()): Program {
  const fn = p.getFunction({ module: p.upload({ kind: "module", source }), name: "f" });
  p.return_({ key: "out", value: p.run({ fn, args }) });
  return p;
}

/** A program returning `[n bytes, 5*m bytes]`. */
function making(n: number, m = 1): Program {
  return calling(MAKE, [n, m]);
}

/** A program returning the length and SHA-256 of a bytes upload of `value`. */
function reading(value: KeptReturn | Uint8Array): Program {
  const p = new Program();
  const data = p.upload({ kind: "bytes", value });
  return calling(
    "import hashlib\ndef f(b):\n    return [len(b), hashlib.sha256(b).hexdigest()]\n",
    [data],
    p,
  );
}

function pair(result: { get(key: string): ResultValue }): ResultValue[] {
  return result.get("out") as ResultValue[];
}

const EXPECTED = new Uint8Array(4096).map((_, i) => i % 256);

for (const mode of MODES) {
  Deno.test(`kept returns: kept, named by a later program, nothing else changes (${mode.name})`, async () => {
    const server = await startServer(mode.config);
    try {
      await using client = new Client(server.url);
      const first = await client.execute(making(4096), { keepReturns: 1024 });
      assert.equal(first.status, "COMPLETED");
      const [big, small] = pair(first);
      assert.ok(big instanceof KeptReturn);
      assert.deepEqual([big.kind, big.size, big.sha256], ["bytes", 4096, sha256Hex(EXPECTED)]);
      assert.deepEqual(small, new TextEncoder().encode("small")); // under 1024 bytes: sent
      assert.equal(first.node, null); // a server, not a Router

      // The next program sends no bytes for it: the server has them.
      const program = reading(big);
      assert.equal(program.blobs.size, 0);
      const second = await client.execute(program);
      assert.deepEqual(pair(second), [4096, sha256Hex(EXPECTED)]);

      // Without the option, the same program's answer is today's.
      const plain = await client.execute(making(4096));
      assert.deepEqual(pair(plain)[0], EXPECTED);
    } finally {
      await server.stop();
    }
  });
}

Deno.test("kept returns: a value returned as Chunks is kept from its pieces, or sent joined", async () => {
  const server = await startServer({});
  try {
    await using client = new Client(server.url);
    const p = calling(
      "from kcoral_runtime.values import Chunks\n" +
        "def f():\n    data = bytes(range(256)) * 16\n" +
        "    return [Chunks([data[:100], b'', memoryview(data)[100:]]), Chunks([b'ab', b'c'])]\n",
    );
    const [kept, sent] = pair(await client.execute(p, { keepReturns: 1024 }));
    assert.ok(kept instanceof KeptReturn);
    assert.deepEqual([kept.kind, kept.size, kept.sha256], ["bytes", 4096, sha256Hex(EXPECTED)]);
    assert.deepEqual(sent, new TextEncoder().encode("abc"));
    assert.deepEqual(pair(await client.execute(reading(kept))), [4096, sha256Hex(EXPECTED)]);
    // Not kept at all: the whole value comes back joined.
    assert.deepEqual(pair(await client.execute(p))[0], EXPECTED);
  } finally {
    await server.stop();
  }
});

Deno.test("kept returns: from a bubblewrap worker (the sandbox CI installs)", async () => {
  const server = await startServer({ sandbox: "bubblewrap" });
  try {
    assert.equal(server.app.sandbox, "bubblewrap", "the sandbox probe failed: install bubblewrap");
    await using client = new Client(server.url);
    const kept = pair(await client.execute(making(4096), { keepReturns: 1024 }))[0];
    assert.ok(kept instanceof KeptReturn);
    assert.deepEqual(pair(await client.execute(reading(kept))), [4096, sha256Hex(EXPECTED)]);
    // 65 MiB: read into bytes on huge pages where the kernel allows (huge_pages.py).
    const large = pair(await client.execute(making(65 << 20), { keepReturns: 1024 }))[0];
    assert.ok(large instanceof KeptReturn);
    assert.deepEqual(pair(await client.execute(reading(large))), [65 << 20, large.sha256]);
  } finally {
    await server.stop();
  }
});

Deno.test("kept returns: a kept tensor keeps its dtype and shape (simulated GPU)", async () => {
  const server = await startServer(MODES[1].config);
  try {
    await using client = new Client(server.url);
    const p = new Program();
    const mod = p.upload({
      kind: "module",
      source:
        "import torch\ndef f():\n    return torch.arange(12, dtype=torch.float32).reshape(3, 4)\n",
    });
    p.return_({ key: "t", value: p.run({ fn: p.getFunction({ module: mod, name: "f" }) }) });
    const kept = (await client.execute(p, { keepReturns: 0 })).get("t");
    assert.ok(kept instanceof KeptReturn);
    assert.deepEqual([kept.kind, kept.dtype, kept.shape, kept.size], [
      "tensor",
      "float32",
      [3, 4],
      48,
    ]);

    const q = new Program();
    const t = q.upload({ kind: "tensor", value: kept });
    const sum = q.upload({ kind: "module", source: "def f(t):\n    return t.sum().item(), t\n" });
    q.return_({
      key: "out",
      value: q.run({ fn: q.getFunction({ module: sum, name: "f" }), args: [t] }),
    });
    const [total, back] = (await client.execute(q)).get("out") as ResultValue[];
    assert.equal(total, 66);
    assert.ok(back instanceof Tensor);
    assert.deepEqual(back.shape, [3, 4]);
    // A tensor of another size cannot name it.
    assert.throws(() =>
      q.upload({ kind: "tensor", value: kept, shape: [12, 1], dtype: "float64" })
    );
  } finally {
    await server.stop();
  }
});

Deno.test("kept returns: over the cache's share it is sent; dropped, the next program is told", async () => {
  // A request's kept returns may take a quarter of the cache: 2048 bytes here.
  const server = await startServer({ cacheCapacityBytes: 8192 });
  try {
    await using client = new Client(server.url);
    const [sent] = pair(await client.execute(making(4096), { keepReturns: 0 }));
    assert.deepEqual(sent, EXPECTED);

    const keptOne = pair(await client.execute(making(2048, 0), { keepReturns: 1 }))[0];
    assert.ok(keptOne instanceof KeptReturn);
    // Four more such values push the first out of the 8 KiB cache (least recently used first).
    for (let i = 1; i <= 4; i++) {
      const p = new Program();
      const mod = p.upload({
        kind: "module",
        source: `def f():\n    return bytes([${i}]) * 2048\n`,
      });
      p.return_({ key: "out", value: p.run({ fn: p.getFunction({ module: mod, name: "f" }) }) });
      assert.ok((await client.execute(p, { keepReturns: 1 })).get("out") instanceof KeptReturn);
    }
    await assert.rejects(
      () => client.execute(reading(keptOne)),
      (error: unknown) =>
        error instanceof ProtocolError && error.message.includes(keptOne.sha256) &&
        error.message.startsWith("server misses blobs with no local bytes to send"),
    );
  } finally {
    await server.stop();
  }
});

Deno.test("kept returns: a malformed header is a 400 that names it, and the server goes on", async () => {
  const server = await startServer();
  try {
    const program = JSON.stringify(callProgram("def f():\n    return 1\n", "f"));
    const form = new FormData();
    form.append("program", new Blob([program], { type: "application/json" }));
    const response = await fetch(`${server.url}/execute`, {
      method: "POST",
      body: form,
      headers: { "X-KCoral-Keep-Returns": "lots" },
    });
    assert.equal(response.status, 400);
    const body = await response.json();
    assert.equal(body.error.kind, "parse");
    assert.match(body.error.message, /X-KCoral-Keep-Returns must be .* not "lots"/);
    await using client = new Client(server.url);
    assert.equal((await client.execute(making(256))).status, "COMPLETED");
    await assert.rejects(() => client.execute(making(256), { keepReturns: -1 }));
  } finally {
    await server.stop();
  }
});

Deno.test("kept returns: through a Router, the node that kept them runs the next program", async () => {
  const router = await startRouter();
  const nodes: Awaited<ReturnType<typeof startNode>>[] = [];
  try {
    nodes.push(await startNode(router.url, "keep-a"), await startNode(router.url, "keep-b"));
    await waitForCapacity(router.url, 2);
    await using client = new Client(router.url);
    for (let i = 0; i < 4; i++) {
      const first = await client.execute(making(4096), { keepReturns: 1024 });
      const kept = pair(first)[0];
      assert.ok(kept instanceof KeptReturn);
      assert.ok(first.node === "keep-a" || first.node === "keep-b", String(first.node));
      const second = await client.execute(reading(kept), { node: first.node! });
      assert.equal(second.node, first.node);
      assert.deepEqual(pair(second), [4096, sha256Hex(EXPECTED)]);
    }
  } finally {
    for (const node of nodes) await node.stop();
    await router.stop();
  }
});
