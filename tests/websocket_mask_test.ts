/**
 * Client masking (link/websocket_mask.ts) against the byte-by-byte definition of RFC 6455 §5.3,
 * across the 64 KiB scratch's piece boundaries and the SIMD loop's 16-byte tail.
 */
import assert from "node:assert/strict";
import { maskInto } from "../link/websocket_mask.ts";
import { outputWithInput } from "./_child.ts";

function _reference(payload: Uint8Array, key: Uint8Array): Uint8Array {
  return payload.map((byte, i) => byte ^ key[i % 4]);
}

Deno.test("websocket mask: every length and offset equals the byte-wise XOR", () => {
  const backing = Uint8Array.from({ length: 200_000 }, (_, i) => (i * 167 + 13) & 0xff);
  const key = new Uint8Array([0x9a, 0x01, 0xff, 0x5c]);
  const lengths = [
    0,
    1,
    3,
    4,
    15,
    16,
    17,
    31,
    33,
    65_535,
    65_536,
    65_537,
    65_551,
    131_072,
    196_613,
  ];
  for (const offset of [0, 1, 2, 3, 5]) {
    for (const length of lengths) {
      const payload = backing.subarray(offset, offset + length);
      // An unaligned, larger output: only its first `length` bytes are written.
      const outBacking = new Uint8Array(length + 9).fill(0xee);
      const out = outBacking.subarray(3);
      maskInto(payload, key, out);
      assert.deepEqual(
        out.subarray(0, length),
        _reference(payload, key),
        `offset ${offset}, length ${length}`,
      );
      assert.ok(out.subarray(length).every((b) => b === 0xee), "bytes past the payload untouched");
    }
  }
});

Deno.test("websocket mask: masking twice gives the payload back, for random keys", () => {
  const payload = Uint8Array.from({ length: 70_001 }, () => Math.random() * 256);
  for (let round = 0; round < 20; round++) {
    const key = crypto.getRandomValues(new Uint8Array(4));
    const once = new Uint8Array(payload.length);
    const twice = new Uint8Array(payload.length);
    maskInto(payload, key, once);
    assert.deepEqual(once, _reference(payload, key));
    maskInto(once, key, twice);
    assert.deepEqual(twice, payload);
  }
});

Deno.test("websocket mask: a key that is not 4 bytes, or an output too short, is refused", () => {
  assert.throws(
    () => maskInto(new Uint8Array(4), new Uint8Array(3), new Uint8Array(4)),
    /4 bytes, not 3/,
  );
  assert.throws(
    () => maskInto(new Uint8Array(5), new Uint8Array(4), new Uint8Array(4)),
    /out holds 4 bytes, the payload 5/,
  );
});

Deno.test("websocket mask: a message masked piece by piece, each at its phase, equals it masked whole", () => {
  const message = Uint8Array.from({ length: 300_007 }, (_, i) => (i * 29 + 3) & 0xff);
  const key = new Uint8Array([0x11, 0x22, 0x33, 0x44]);
  for (const cuts of [[37], [1, 2, 3], [37, 65_536 + 37], [5, 70_000, 70_001, 200_000]]) {
    const out = new Uint8Array(message.length);
    let from = 0;
    for (const to of [...cuts, message.length]) {
      maskInto(message.subarray(from, to), key, out.subarray(from), from);
      from = to;
    }
    assert.deepEqual(out, _reference(message, key), `cuts ${cuts}`);
  }
});

Deno.test("websocket mask: where WebAssembly cannot run (--jitless), bytes are masked all the same", async () => {
  const module = new URL("../link/websocket_mask.ts", import.meta.url).href;
  const script = `
    import { maskInto } from ${JSON.stringify(module)};
    if (typeof WebAssembly !== "undefined") {
      try { new WebAssembly.Module(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0])); console.log("wasm runs"); } catch {}
    }
    const key = new Uint8Array([9, 8, 7, 6]);
    const message = Uint8Array.from({ length: 70_001 }, (_, i) => (i * 31 + 5) & 0xff);
    for (const [from, to] of [[0, 70_001], [3, 40_000], [37, 65_573]]) {
      const out = new Uint8Array(to - from);
      maskInto(message.subarray(from, to), key, out, from);
      if (!out.every((b, i) => b === (message[from + i] ^ key[(from + i) % 4]))) throw new Error("wrong at " + from);
    }
    console.log("masked");
  `;
  const { code, stdout, stderr } = await outputWithInput(
    Deno.execPath(),
    ["run", "--no-config", "--v8-flags=--jitless", "-"],
    script,
  );
  const text = new TextDecoder().decode(stdout);
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  assert.equal(text.trim(), "masked", "WebAssembly did not run, and the fallback masked correctly");
});
