import assert from "node:assert/strict";
import { ConnectionInput } from "./http1_input.ts";

/** A connection whose reads take `chunks` in turn, recording the room each read was given. */
function recordingConn(chunks: number[], rooms: number[]): Deno.Conn {
  return {
    read(buffer: Uint8Array): Promise<number | null> {
      rooms.push(buffer.length);
      const n = chunks.shift();
      return Promise.resolve(n === undefined ? null : Math.min(n, buffer.length));
    },
  } as unknown as Deno.Conn;
}

Deno.test("http1_input: a read never gets a short tail of the buffer when its front is free", async () => {
  const rooms: number[] = [];
  const input = new ConnectionInput(recordingConn([3000, 3500, 100, 10], rooms));
  await input.more();
  input.start = input.end; // all consumed: the next read starts at the front
  await input.more();
  assert.equal(input.buffered, 3500);
  input.start = 3400; // 100 left, 596 bytes of tail: moved to the front first
  await input.more();
  assert.deepEqual([input.start, input.end], [0, 200]);
  input.start = 50; // 150 left with a long tail: read where they are
  await input.more();
  assert.deepEqual(rooms, [4096, 4096, 3996, 3896]);
  assert.deepEqual([input.start, input.end], [50, 210]);
});
