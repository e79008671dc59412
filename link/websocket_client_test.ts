/**
 * The node's WebSocket client (link/websocket_client.ts) against Deno's own WebSocket server
 * and against a raw TCP peer that writes frames by hand (fragments, ping, bad frames).
 */
import assert from "node:assert/strict";
import { WebSocketClient, type WebSocketCloseInfo } from "./websocket_client.ts";

interface _Seen {
  open: boolean;
  messages: (string | ArrayBuffer)[];
  errors: string[];
  closed: Promise<WebSocketCloseInfo>;
}

function _watch(socket: WebSocketClient): _Seen {
  const seen: _Seen = {
    open: false,
    messages: [],
    errors: [],
    closed: new Promise((resolve) => (socket.onclose = resolve)),
  };
  socket.onopen = () => (seen.open = true);
  socket.onmessage = (event) => seen.messages.push(event.data);
  socket.onerror = (event) => seen.errors.push(event.message);
  return seen;
}

/** A Deno WebSocket server that sends every message back as it came. */
function _echoServer(): Deno.HttpServer<Deno.NetAddr> {
  return Deno.serve({ port: 0, onListen() {} }, (request) => {
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.binaryType = "arraybuffer";
    socket.onmessage = (event) => socket.send(event.data);
    return response;
  });
}

async function _until(test: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !test(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(test(), "condition not reached in time");
}

Deno.test("websocket client: text and binary both ways, large and small, headers sent", async () => {
  let authorization: string | null = null;
  const received: (string | number)[] = [];
  const server = Deno.serve({ port: 0, onListen() {} }, (request) => {
    authorization = request.headers.get("authorization");
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.binaryType = "arraybuffer";
    socket.onmessage = (event) => {
      if (typeof event.data === "string") {
        received.push(event.data);
        socket.send(event.data.toUpperCase());
      } else {
        const bytes = new Uint8Array(event.data);
        received.push(bytes.length);
        socket.send(bytes.map((b) => b ^ 0xff));
      }
    };
    return response;
  });
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/link`, {
    headers: { authorization: "Bearer sekrit" },
  });
  const seen = _watch(socket);
  await _until(() => seen.open);
  assert.equal(socket.readyState, WebSocketClient.OPEN);
  assert.equal(authorization, "Bearer sekrit");
  const sizes = [0, 1, 125, 126, 65535, 65536, 5 * 1024 * 1024 + 3];
  const payloads = sizes.map((n) => Uint8Array.from({ length: n }, (_, i) => (i * 31) & 0xff));
  socket.send("héllo");
  for (const payload of payloads) socket.send(payload);
  await _until(() => seen.messages.length === sizes.length + 1);
  assert.deepEqual(received, ["héllo", ...sizes]);
  assert.equal(seen.messages[0], "HÉLLO");
  for (const [i, payload] of payloads.entries()) {
    const back = new Uint8Array(seen.messages[i + 1] as ArrayBuffer);
    assert.equal(back.length, payload.length);
    assert.ok(back.every((b, k) => b === (payload[k] ^ 0xff)), `payload of ${sizes[i]} bytes`);
  }
  socket.close(4001, "bye");
  const closed = await seen.closed;
  assert.deepEqual(closed, { code: 4001, reason: "bye", wasClean: true }); // echoed
  assert.equal(socket.readyState, WebSocketClient.CLOSED);
  assert.deepEqual(seen.errors, []);
  await server.shutdown();
});

Deno.test("websocket client: the server's close code and reason reach onclose", async () => {
  const server = Deno.serve({ port: 0, onListen() {} }, (request) => {
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.onopen = () => socket.close(4010, "slot discarded");
    return response;
  });
  const seen = _watch(new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`));
  const closed = await seen.closed;
  assert.deepEqual(closed, { code: 4010, reason: "slot discarded", wasClean: true });
  await server.shutdown();
});

Deno.test("websocket client: a refused upgrade is an error, then close 1006", async () => {
  const server = Deno.serve(
    { port: 0, onListen() {} },
    () => new Response("no", { status: 401 }),
  );
  const seen = _watch(new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`));
  const closed = await seen.closed;
  assert.equal(closed.code, 1006);
  assert.equal(seen.open, false);
  assert.match(seen.errors[0], /unexpected server response: 401/);
  await server.shutdown();
});

Deno.test("websocket client: nothing listening is an error, then close 1006", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const seen = _watch(new WebSocketClient(`ws://127.0.0.1:${port}/`));
  assert.equal((await seen.closed).code, 1006);
  assert.equal(seen.errors.length, 1);
});

Deno.test("websocket client: closing while connecting closes at once", async () => {
  const server = Deno.serve({ port: 0, onListen() {} }, (request) => {
    const { response } = Deno.upgradeWebSocket(request);
    return response;
  });
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
  const seen = _watch(socket);
  socket.close();
  assert.equal((await seen.closed).code, 1006);
  assert.equal(seen.open, false);
  await new Promise((r) => setTimeout(r, 50));
  await server.shutdown();
});

/** A raw peer: completes the handshake, then writes `frames` byte by byte, and records what
 * the client sent (unmasked); it answers the client's close unless `answersClose` is false. */
function _rawPeer(frames: Uint8Array, answersClose = true) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  const fromClient: { opcode: number; payload: Uint8Array }[] = [];
  const done = (async () => {
    const conn = await listener.accept();
    listener.close();
    const buffer = new Uint8Array(65536);
    let have = 0;
    let head = "";
    while (!head.includes("\r\n\r\n")) {
      have += (await conn.read(buffer.subarray(have)))!;
      head = new TextDecoder().decode(buffer.subarray(0, have));
    }
    const key = /Sec-WebSocket-Key: (\S+)/i.exec(head)![1];
    const digest = await crypto.subtle.digest(
      "SHA-1",
      new TextEncoder().encode(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"),
    );
    const accept = btoa(String.fromCharCode(...new Uint8Array(digest)));
    await conn.write(new TextEncoder().encode(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        `Sec-WebSocket-Accept: ${accept}\r\n\r\n`,
    ));
    for (const byte of frames) await conn.write(new Uint8Array([byte]));
    // Read what the client sends until it closes.
    let pending = new Uint8Array(0);
    for (;;) {
      const chunk = new Uint8Array(4096);
      const n = await conn.read(chunk).catch(() => null);
      if (n === null) break;
      pending = new Uint8Array([...pending, ...chunk.subarray(0, n)]);
      while (pending.length >= 6) {
        const length = pending[1] & 0x7f; // the peer's tests send short frames only
        if (pending.length < 6 + length) break;
        const mask = pending.subarray(2, 6);
        const payload = pending.slice(6, 6 + length).map((b, i) => b ^ mask[i & 3]);
        assert.equal(pending[1] & 0x80, 0x80, "client frames are masked");
        fromClient.push({ opcode: pending[0] & 0x0f, payload });
        pending = pending.slice(6 + length);
        if (answersClose && pending.length === 0 && fromClient.at(-1)!.opcode === 8) {
          await conn.write(new Uint8Array([0x88, 0])).catch(() => {});
          conn.close();
          return;
        }
      }
    }
    conn.close();
  })();
  return { url: `ws://127.0.0.1:${port}/`, fromClient, done };
}

const _text = (s: string) => [...new TextEncoder().encode(s)];

Deno.test("websocket client: fragments are joined, pings answered, frames split across reads", async () => {
  const peer = await _rawPeer(
    new Uint8Array([
      0x01,
      3,
      ..._text("abc"), // text, not final
      0x89,
      2,
      7,
      8, // ping between fragments
      0x80,
      3,
      ..._text("def"), // final continuation
      0x82,
      126,
      0x01,
      0x00,
      ...new Array(256).fill(9), // binary, 16-bit length
    ]),
  );
  const socket = new WebSocketClient(peer.url);
  const seen = _watch(socket);
  await _until(() => seen.messages.length === 2);
  assert.equal(seen.messages[0], "abcdef");
  assert.deepEqual([...new Uint8Array(seen.messages[1] as ArrayBuffer)], new Array(256).fill(9));
  socket.close(1000, "");
  await seen.closed;
  await peer.done;
  assert.deepEqual(peer.fromClient[0], { opcode: 10, payload: new Uint8Array([7, 8]) });
  assert.equal(peer.fromClient.at(-1)!.opcode, 8);
});

Deno.test("websocket client: a close the server never answers is given up: an error, then 1006", async () => {
  const peer = await _rawPeer(new Uint8Array(0), false);
  const socket = new WebSocketClient(peer.url);
  const seen = _watch(socket);
  await _until(() => seen.open);
  socket.close(1000, "done");
  assert.equal(socket.readyState, WebSocketClient.CLOSING);
  assert.deepEqual(await seen.closed, { code: 1006, reason: "", wasClean: false });
  await peer.done;
  assert.equal(seen.errors.length, 1);
  assert.deepEqual(peer.fromClient.map((f) => f.opcode), [8]);
});

for (
  const [name, frames, code] of [
    ["a masked server frame", [0x81, 0x81, 1, 2, 3, 4, 0x60], 1002],
    ["reserved bits", [0xc1, 1, 0x61], 1002],
    ["an unknown opcode", [0x83, 0], 1002],
    ["a continuation without a start", [0x80, 1, 0x61], 1002],
    ["invalid UTF-8 in text", [0x81, 2, 0xc3, 0x28], 1007],
    ["a message over the limit", [0x82, 126, 0x04, 0x01, ...new Array(1025).fill(0)], 1009],
  ] as [string, number[], number][]
) {
  Deno.test(`websocket client: ${name} closes the connection with ${code}`, async () => {
    const peer = await _rawPeer(new Uint8Array(frames));
    const socket = new WebSocketClient(peer.url, { maxMessageBytes: 1024 });
    const seen = _watch(socket);
    const closed = await seen.closed;
    await peer.done;
    assert.equal(closed.code, 1006);
    assert.equal(closed.wasClean, false);
    assert.equal(seen.messages.length, 0);
    assert.equal(seen.errors.length, 1);
    const close = peer.fromClient.find((f) => f.opcode === 8)!;
    assert.equal((close.payload[0] << 8) | close.payload[1], code);
  });
}

Deno.test("websocket client: payloads at any offset and length arrive intact (masked in pieces, SIMD and tail)", async () => {
  const server = _echoServer();
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
  const seen = _watch(socket);
  await _until(() => seen.open);
  const backing = Uint8Array.from({ length: 70_010 }, (_, i) => (i * 131 + 7) & 0xff);
  const sent: Uint8Array[] = [];
  for (const offset of [0, 1, 2, 3, 4]) {
    for (
      const length of [0, 1, 2, 3, 5, 7, 17, 125, 126, 127, 4097, 65_535, 65_536, 65_537, 70_001]
    ) {
      const payload = backing.subarray(offset, offset + length);
      sent.push(payload);
      socket.send(payload);
    }
  }
  await _until(() => seen.messages.length === sent.length);
  for (const [i, payload] of sent.entries()) {
    assert.deepEqual(new Uint8Array(seen.messages[i] as ArrayBuffer), payload, `message ${i}`);
  }
  socket.close();
  await seen.closed;
  await server.shutdown();
});

Deno.test("websocket client: large frames sent one after another reuse buffers and stay intact", async () => {
  const server = _echoServer();
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`, {
    maxMessageBytes: 1 << 20,
  });
  const seen = _watch(socket);
  await _until(() => seen.open);
  // Rounds of same-size frames (each written frame's buffer kept for the next), sizes changing
  // between rounds, a small text between: every payload must arrive as it was sent.
  const sent: (Uint8Array | string)[] = [];
  for (const [round, length] of [262_181, 262_181, 100_003, 65_536, 262_181].entries()) {
    for (let i = 0; i < 6; i++) {
      const payload = Uint8Array.from({ length }, (_, j) => (j * 31 + round * 7 + i) & 0xff);
      sent.push(payload);
      socket.send(payload);
      // Let some writes finish, so that later frames take their buffers.
      if (i % 2 === 1) await new Promise((resolve) => setTimeout(resolve, 5));
    }
    sent.push(`round ${round}`);
    socket.send(`round ${round}`);
  }
  await _until(() => seen.messages.length === sent.length);
  for (const [i, payload] of sent.entries()) {
    if (typeof payload === "string") assert.equal(seen.messages[i], payload, `message ${i}`);
    else assert.deepEqual(new Uint8Array(seen.messages[i] as ArrayBuffer), payload, `message ${i}`);
  }
  socket.close();
  await seen.closed;
  await server.shutdown();
});

Deno.test("websocket client: a message sent in parts arrives as their concatenation", async () => {
  const server = _echoServer();
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`, {
    maxMessageBytes: 1 << 20,
  });
  const seen = _watch(socket);
  await _until(() => seen.open);
  const backing = Uint8Array.from({ length: 600_000 }, (_, i) => (i * 131 + 7) & 0xff);
  const messages: Uint8Array[][] = [
    [backing.subarray(0, 37), backing.subarray(1000, 1000 + 262_144)],
    [backing.subarray(3, 4), backing.subarray(5, 7), backing.subarray(9, 130)],
    [new Uint8Array(0), backing.subarray(11, 70_011)],
    [backing.subarray(1, 38), backing.subarray(100_001, 362_145)],
  ];
  for (const parts of messages) socket.sendParts(parts);
  await _until(() => seen.messages.length === messages.length);
  for (const [i, parts] of messages.entries()) {
    const expected = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const part of parts) (expected.set(part, at), at += part.length);
    assert.deepEqual(new Uint8Array(seen.messages[i] as ArrayBuffer), expected, `message ${i}`);
  }
  socket.close();
  await seen.closed;
  await server.shutdown();
});

Deno.test("websocket client: WebSocketClient", async () => {
  const server = Deno.serve({ port: 0, onListen() {} }, (request) => {
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.onmessage = (event) => socket.send(`echo ${event.data}`);
    return response;
  });
  const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
  const answer = await new Promise<string>((resolve) => {
    socket.onopen = () => socket.send("hello");
    socket.onmessage = (event) => resolve(event.data as string);
  });
  if (answer !== "echo hello") throw new Error(answer);
  socket.close(1000, "done");
  await new Promise((resolve) => (socket.onclose = resolve));
  await server.shutdown();
});
