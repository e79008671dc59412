/**
 * protocol/utf8.ts against the platform's strict decoder: the same text for every input, and the
 * same refusal for bytes that are not UTF-8, with and without a kept byte order mark.
 */
import assert from "node:assert/strict";
import { decodeUtf8 } from "./utf8.ts";

function strict(bytes: Uint8Array, keepBom: boolean): string | "refused" {
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: keepBom }).decode(bytes);
  } catch {
    return "refused";
  }
}

function ours(bytes: Uint8Array, keepBom: boolean): string | "refused" {
  try {
    return decodeUtf8(bytes, { keepBom });
  } catch (error) {
    assert.ok(error instanceof TypeError, String(error));
    return "refused";
  }
}

Deno.test("utf8: decodeUtf8 decodes and refuses exactly as the strict TextDecoder", () => {
  const encoder = new TextEncoder();
  const samples: Uint8Array[] = [
    new Uint8Array(0),
    encoder.encode('{"t":"request_head","headers":[["x-a","é"]]}'),
    encoder.encode("\uFEFFwith a byte order mark"),
    encoder.encode("a real \uFFFD replacement character"),
    encoder.encode("\u{1F600} astral"),
    new Uint8Array([0xc3]), // cut short
    new Uint8Array([0x61, 0xff, 0x62]), // never valid
    new Uint8Array([0xed, 0xa0, 0x80]), // a surrogate
    new Uint8Array([0xc0, 0xaf]), // overlong
    new Uint8Array([0xef, 0xbb, 0xbf, 0xc3]), // a BOM, then cut short
  ];
  // Random bytes: mostly invalid; random ASCII-heavy text: mostly valid.
  let seed = 7;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) & 0xff;
  for (let i = 0; i < 500; i++) {
    const length = next() % 40;
    samples.push(Uint8Array.from({ length }, () => next()));
    samples.push(Uint8Array.from({ length }, () => next() & (i % 3 === 0 ? 0xff : 0x7f)));
  }
  let refused = 0;
  for (const bytes of samples) {
    for (const keepBom of [false, true]) {
      const expected = strict(bytes, keepBom);
      assert.equal(ours(bytes, keepBom), expected, `${[...bytes]} keepBom=${keepBom}`);
      if (expected === "refused") refused++;
    }
  }
  assert.ok(refused > 100, "the samples hold invalid input");
});

Deno.test("utf8: decodeUtf8", () => {
  if (decodeUtf8(new Uint8Array([0x68, 0xc3, 0xa9])) !== "hé") throw new Error();
  if (decodeUtf8(new Uint8Array([0xef, 0xbf, 0xbd])) !== "\uFFFD") throw new Error("a real U+FFFD");
  let refused = false;
  try {
    decodeUtf8(new Uint8Array([0x68, 0xc3]));
  } catch (error) {
    refused = error instanceof TypeError;
  }
  if (!refused) throw new Error("invalid UTF-8 taken");
});
