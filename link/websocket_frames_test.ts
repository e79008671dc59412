import {
  closePayload,
  closeQuietly,
  frameProblem,
  FrameReader,
  FrameWriter,
  messageData,
} from "./websocket_frames.ts";

Deno.test("websocket frames: frameProblem", () => {
  const text = { fin: true, rsv: 0, opcode: 1, masked: true, length: 5, key: new Uint8Array(4) };
  if (frameProblem(text, 0, true) !== null) throw new Error();
  if (frameProblem(text, 0, false) === null) throw new Error(); // a masked frame from a server
});

Deno.test("websocket frames: messageData", () => {
  if (messageData(new TextEncoder().encode("hi"), 1) !== "hi") throw new Error();
  if ((messageData(new Uint8Array([1, 2]), 2) as ArrayBuffer).byteLength !== 2) throw new Error();
});

Deno.test("websocket frames: closePayload", () => {
  const payload = closePayload(1000, "done");
  if (payload.length !== 6 || ((payload[0] << 8) | payload[1]) !== 1000) throw new Error();
});

Deno.test("websocket frames: FrameReader", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const peer = Deno.connect({ hostname: "127.0.0.1", port: (listener.addr as Deno.NetAddr).port });
  const conn = await listener.accept();
  await (await peer).write(new Uint8Array([0x81, 2, 0x68, 0x69])); // "hi", unmasked
  const reader = new FrameReader(conn, new Uint8Array(0));
  const header = (await reader.header())!;
  const payload = await reader.payload(header.length, header.key);
  if (new TextDecoder().decode(payload!) !== "hi") throw new Error();
  (await peer).close();
  conn.close();
  listener.close();
});

Deno.test("websocket frames: FrameWriter", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const peer = await Deno.connect({
    hostname: "127.0.0.1",
    port: (listener.addr as Deno.NetAddr).port,
  });
  const conn = await listener.accept();
  const writer = new FrameWriter(conn, false);
  writer.write(1, new TextEncoder().encode("hi"));
  await writer.written;
  const frame = new Uint8Array(4);
  await peer.read(frame);
  if (frame.join() !== [0x81, 2, 0x68, 0x69].join()) throw new Error();
  writer.close();
  peer.close();
  conn.close();
  listener.close();
});

Deno.test("websocket frames: closeQuietly", () => {
  closeQuietly(null);
});
