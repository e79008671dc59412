/**
 * The node link's whole frames (link/messages.ts): what they carry round trip, and every
 * malformed one refused with a LinkMessageError naming the problem.
 */
import assert from "node:assert/strict";
import {
  decodeWholeFrame,
  encodeWholeFrame,
  LinkMessageError,
  MAX_DATA_BYTES,
  parseSlotMessage,
  type RequestHead,
} from "./messages.ts";

const id = "0f6c2b4e-1111-4222-8333-444455556666";
const head: RequestHead = {
  t: "request_head",
  request_id: id,
  headers: [["content-type", "multipart/form-data; boundary=x"], ["x-é", "ü"]],
  content_length: 3,
};

Deno.test("node link frames: a whole frame carries its head and body, empty or full", () => {
  for (const length of [0, 3, MAX_DATA_BYTES]) {
    const body = Uint8Array.from({ length }, (_, i) => i & 0xff);
    const back = decodeWholeFrame(encodeWholeFrame({ ...head, content_length: length }, body)!);
    assert.deepEqual(back.head, { ...head, content_length: length });
    assert.deepEqual(back.bytes, body);
  }
  assert.throws(() => encodeWholeFrame(head, new Uint8Array(MAX_DATA_BYTES + 1))!, RangeError);
});

Deno.test("node link frames: malformed whole frames are refused", () => {
  const good = encodeWholeFrame(head, new Uint8Array([1, 2, 3]))!;
  const textLength = new DataView(good.buffer).getUint32(37);
  const withLength = (n: number) => {
    const frame = good.slice();
    new DataView(frame.buffer).setUint32(37, n);
    return frame;
  };
  const withHead = (text: string | Uint8Array, frameId = id) => {
    const bytes = typeof text === "string" ? new TextEncoder().encode(text) : text;
    const frame = new Uint8Array(41 + bytes.length);
    frame[0] = 2;
    for (let i = 0; i < 36; i++) frame[1 + i] = frameId.charCodeAt(i);
    new DataView(frame.buffer).setUint32(37, bytes.length);
    frame.set(bytes, 41);
    return frame;
  };
  const cases: [string, Uint8Array, RegExp][] = [
    ["too short", good.subarray(0, 40), /malformed whole frame/],
    ["not a whole frame", Uint8Array.from([1, ...good.subarray(1)]), /malformed whole frame/],
    ["head past the frame", withLength(good.length), /malformed head length/],
    ["head over the text limit", withLength(2 ** 32 - 1), /malformed head length/],
    ["head cut short", withLength(textLength - 1), /not JSON/],
    ["head not UTF-8", withHead(new Uint8Array([0x7b, 0xff, 0x7d])), /not UTF-8/],
    ["head is an end", withHead(JSON.stringify({ t: "end", request_id: id })), /'end' for a head/],
    [
      "head for another request",
      withHead(JSON.stringify(head), id.replace("0f6c", "1f6c")),
      /another request/,
    ],
    [
      "body over one data frame",
      encodeWholeFrameUnchecked(MAX_DATA_BYTES + 1),
      /body over 262144 bytes/,
    ],
  ];
  for (const [name, frame, message] of cases) {
    assert.throws(() => decodeWholeFrame(frame), (error: unknown) => {
      assert.ok(error instanceof LinkMessageError, `${name}: ${error}`);
      assert.match(error.message, message, name);
      return true;
    });
  }
  // A head with malformed headers is refused by the same rules as a text request_head.
  const badHeaders = JSON.stringify({ ...head, headers: [["", "x"]] });
  assert.throws(() => parseSlotMessage(badHeaders), /malformed headers/);
  assert.throws(() => decodeWholeFrame(withHead(badHeaders)), /malformed headers/);
});

/** A whole frame with a body of `length` bytes, built past the encoder's limit. */
function encodeWholeFrameUnchecked(length: number): Uint8Array {
  const small = encodeWholeFrame(head, new Uint8Array(0))!;
  const frame = new Uint8Array(small.length + length);
  frame.set(small);
  return frame;
}
