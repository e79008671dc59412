/**
 * The node link's frames (link/frames.ts): every combination of head, body and end round trip,
 * and every malformed frame refused with a LinkMessageError naming the problem.
 */
import assert from "node:assert/strict";
import {
  decodeRequestFrame,
  decodeResponseFrame,
  encodeFrame,
  frameWithRoom,
  markEnd,
  MAX_FRAME_BYTES,
} from "./frames.ts";
import {
  LinkMessageError,
  MAX_DATA_BYTES,
  MAX_TEXT_BYTES,
  type RequestHead,
  type ResponseHead,
} from "./messages.ts";

const id = "0f6c2b4e-1111-4222-8333-444455556666";
const head: RequestHead = {
  headers: [["content-type", "multipart/form-data; boundary=x"], ["x-é", "ü"]],
  content_length: 3,
};

Deno.test("frames: a head, bytes and an end in any combination round trip", () => {
  for (const withHead of [false, true]) {
    for (const length of [0, 3, MAX_DATA_BYTES]) {
      for (const end of [false, true]) {
        if (!withHead && length === 0 && !end) continue; // an empty frame: refused below
        const body = Uint8Array.from({ length }, (_, i) => i & 0xff);
        const frame = encodeFrame(id, withHead ? head : null, body, end);
        const back = decodeRequestFrame(frame);
        assert.equal(back.requestId, id);
        assert.deepEqual(back.head, withHead ? head : null);
        assert.deepEqual(back.bytes, body);
        assert.equal(back.end, end);
      }
    }
  }
  const answer: ResponseHead = { status: 503, headers: [["retry-after", "1"]] };
  const back = decodeResponseFrame(encodeFrame(id, answer, new Uint8Array([1]), true));
  assert.deepEqual([back.head, back.bytes.length, back.end], [answer, 1, true]);
  assert.throws(() => encodeFrame(id, head, new Uint8Array(MAX_DATA_BYTES + 1), true), RangeError);
  // The longest frame: a head of the text limit and a full body.
  assert.equal(MAX_FRAME_BYTES, 41 + MAX_TEXT_BYTES + MAX_DATA_BYTES);
});

Deno.test("frames: malformed frames are refused", () => {
  const good = encodeFrame(id, head, new Uint8Array([1, 2, 3]), true);
  const headLength = new DataView(good.buffer).getUint32(37);
  const withLength = (n: number) => {
    const frame = good.slice();
    new DataView(frame.buffer).setUint32(37, n);
    return frame;
  };
  const withHead = (text: string | Uint8Array, frameId = id) => {
    const bytes = typeof text === "string" ? new TextEncoder().encode(text) : text;
    const frame = frameWithRoom(frameId, bytes, 0);
    frame[0] |= 2;
    return frame;
  };
  const withFlags = (flags: number) => Uint8Array.from([flags, ...good.subarray(1)]);
  const cases: [string, Uint8Array, RegExp][] = [
    ["too short", good.subarray(0, 36), /malformed frame/],
    ["an unknown flag", withFlags(4 | 3), /malformed frame/],
    ["no request id", withHead("{}", "x".repeat(36)), /without a request id/],
    ["nothing in it", encodeFrame(id, null, new Uint8Array(0), false), /empty frame/],
    ["a head with no length", good.subarray(0, 40), /malformed head length/],
    ["head past the frame", withLength(good.length), /malformed head length/],
    ["head over the text limit", withLength(2 ** 32 - 1), /malformed head length/],
    ["head cut short", withLength(headLength - 1), /not JSON/],
    ["head not UTF-8", withHead(new Uint8Array([0x7b, 0xff, 0x7d])), /not UTF-8/],
    ["head not an object", withHead("[]"), /not a JSON object/],
    [
      "head with malformed headers",
      withHead('{"headers":[["","x"]],"content_length":0}'),
      /headers/,
    ],
    ["head with a bad length", withHead('{"headers":[],"content_length":-1}'), /content_length/],
    ["body over one frame", encodeUnchecked(MAX_DATA_BYTES + 1), /body over 262144 bytes/],
  ];
  for (const [name, frame, message] of cases) {
    assert.throws(() => decodeRequestFrame(frame), (error: unknown) => {
      assert.ok(error instanceof LinkMessageError, `${name}: ${error}`);
      assert.match(error.message, message, name);
      return true;
    });
  }
  // A request head is no response head, and the other way round.
  assert.throws(() => decodeResponseFrame(good), /invalid status/);
  const answer = encodeFrame(id, { status: 200, headers: [] }, new Uint8Array(0), true);
  assert.throws(() => decodeRequestFrame(answer), /malformed content_length/);
  assert.throws(
    () => decodeResponseFrame(withHead('{"status":101,"headers":[]}')),
    /invalid status/,
  );
  assert.equal(new TextEncoder().encode(JSON.stringify(head)).length, headLength);
});

/** A frame without a head and with a body of `length` bytes, built past the encoder's limit. */
function encodeUnchecked(length: number): Uint8Array {
  const frame = frameWithRoom(id, null, length);
  frame[0] = 2;
  return frame;
}

Deno.test("frames: frameWithRoom", () => {
  const id = "0f6c2b4e-1111-4222-8333-444455556666";
  const head = new TextEncoder().encode('{"status":204,"headers":[]}');
  const frame = frameWithRoom(id, head, 2);
  frame.set([7, 8], frame.length - 2);
  const back = decodeResponseFrame(frame);
  if (back.head?.status !== 204 || back.bytes.length !== 2 || back.end) throw new Error();
});

Deno.test("frames: markEnd", () => {
  const frame = frameWithRoom("0f6c2b4e-1111-4222-8333-444455556666", null, 0);
  markEnd(frame);
  if (!decodeRequestFrame(frame).end) throw new Error();
});

Deno.test("frames: encodeFrame", () => {
  const id = "0f6c2b4e-1111-4222-8333-444455556666";
  const head = { headers: [["content-length", "2"]] as [string, string][], content_length: 2 };
  const back = decodeRequestFrame(encodeFrame(id, head, new Uint8Array([7, 8]), true));
  if (back.head?.content_length !== 2 || back.bytes[1] !== 8 || !back.end) throw new Error();
});

Deno.test("frames: decodeRequestFrame", () => {
  try {
    decodeRequestFrame(new Uint8Array([4]));
    throw new Error("accepted");
  } catch (error) {
    if (!(error instanceof LinkMessageError)) throw error;
  }
});

Deno.test("frames: decodeResponseFrame", () => {
  const id = "0f6c2b4e-1111-4222-8333-444455556666";
  const back = decodeResponseFrame(encodeFrame(id, null, new Uint8Array(3), false));
  if (back.head !== null || back.bytes.length !== 3) throw new Error();
});
