/**
 * The server's WebSocket end (link/websocket_server.ts) behind http/http1_server.ts: against the
 * node's client (link/websocket_client.ts), and against a raw TCP peer that writes frames by
 * hand (fragments, ping, close, bad frames, messages over the limit declared and never sent).
 */
import assert from "node:assert/strict";
import { serveHttp1 } from "../http/http1_server.ts";
import {
  type ServerWebSocket,
  upgradeWebSocket,
  type WebSocketCloseInfo,
  WebSocketHandshakeError,
  type WebSocketLimits,
} from "./websocket_server.ts";
import { WebSocketClient } from "./websocket_client.ts";

const _encoder = new TextEncoder();

interface _Seen {
  messages: (string | ArrayBuffer)[];
  errors: { message: string; code: number }[];
  closed: Promise<WebSocketCloseInfo>;
}

/** A server whose sockets are handed to `onSocket`; handshake refusals answered with status. */
function _server(
  limits: WebSocketLimits,
  onSocket: (socket: ServerWebSocket, seen: _Seen) => void = () => {},
) {
  const sockets: { socket: ServerWebSocket; seen: _Seen }[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) => {
      try {
        const { socket, response } = upgradeWebSocket(request, limits);
        const seen: _Seen = {
          messages: [],
          errors: [],
          closed: new Promise((resolve) => (socket.onclose = resolve)),
        };
        socket.onmessage = (event) => seen.messages.push(event.data);
        socket.onerror = (event) => seen.errors.push(event);
        sockets.push({ socket, seen });
        onSocket(socket, seen);
        return Promise.resolve(response);
      } catch (error) {
        if (!(error instanceof WebSocketHandshakeError)) throw error;
        return Promise.resolve(new Response(error.message, { status: error.status }));
      }
    },
  });
  return { server, sockets, port: server.addr.port };
}

/** A raw peer: the handshake by hand, then frames written and read as bytes. */
class _RawPeer {
  #buffer = new Uint8Array(0);

  private constructor(readonly conn: Deno.Conn) {}

  static async open(port: number, extra = ""): Promise<_RawPeer> {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    const peer = new _RawPeer(conn);
    await peer.write(_encoder.encode(
      "GET /link HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n" +
        "sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
        extra + "\r\n",
    ));
    const head = await peer.#until((text) => text.indexOf("\r\n\r\n"));
    assert.match(head, /^HTTP\/1\.1 101 /);
    assert.match(head, /sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=\r\n/i);
    return peer;
  }

  async write(bytes: Uint8Array): Promise<void> {
    for (let at = 0; at < bytes.length;) at += await this.conn.write(bytes.subarray(at));
  }

  /** Reads until `end(text)` finds the end of a head; returns the head and keeps the rest. */
  async #until(end: (text: string) => number): Promise<string> {
    for (;;) {
      const text = new TextDecoder("latin1").decode(this.#buffer);
      const at = end(text);
      if (at >= 0) {
        this.#buffer = this.#buffer.slice(at + 4);
        return text.slice(0, at + 4);
      }
      if (!(await this.#more())) throw new Error(`connection ended: ${text}`);
    }
  }

  async #more(): Promise<boolean> {
    const chunk = new Uint8Array(65536);
    const n = await this.conn.read(chunk).catch(() => null);
    if (n === null) return false;
    const joined = new Uint8Array(this.#buffer.length + n);
    joined.set(this.#buffer);
    joined.set(chunk.subarray(0, n), this.#buffer.length);
    this.#buffer = joined;
    return true;
  }

  /** The next frame from the server (unmasked), or `null` once the connection ended. */
  async frame(): Promise<{ opcode: number; fin: boolean; payload: Uint8Array } | null> {
    while (this.#buffer.length < 2) if (!(await this.#more())) return null;
    assert.equal(this.#buffer[1] & 0x80, 0, "a server frame is never masked");
    let length = this.#buffer[1] & 0x7f;
    let header = 2;
    if (length === 126) header = 4;
    if (length === 127) header = 10;
    while (this.#buffer.length < header) if (!(await this.#more())) return null;
    if (length === 126) length = (this.#buffer[2] << 8) | this.#buffer[3];
    if (length === 127) length = Number(new DataView(this.#buffer.buffer, 2, 8).getBigUint64(0));
    while (this.#buffer.length < header + length) if (!(await this.#more())) return null;
    const frame = {
      opcode: this.#buffer[0] & 0x0f,
      fin: (this.#buffer[0] & 0x80) !== 0,
      payload: this.#buffer.slice(header, header + length),
    };
    this.#buffer = this.#buffer.slice(header + length);
    return frame;
  }

  /** Reads until the connection ends; whether it did. */
  async ended(): Promise<boolean> {
    while (await this.#more()) this.#buffer = new Uint8Array(0);
    return true;
  }

  close(): void {
    try {
      this.conn.close();
    } catch {
      // already closed
    }
  }
}

/** A client frame: masked with a random key unless `masked` is false. */
function _clientFrame(
  opcode: number,
  payload: Uint8Array,
  options: { fin?: boolean; masked?: boolean; declared?: number } = {},
): Uint8Array {
  const length = options.declared ?? payload.length;
  const masked = options.masked ?? true;
  const size = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const header = new Uint8Array(size + (masked ? 4 : 0));
  header[0] = ((options.fin ?? true) ? 0x80 : 0) | opcode;
  const maskBit = masked ? 0x80 : 0;
  if (size === 2) header[1] = maskBit | length;
  else if (size === 4) {
    header[1] = maskBit | 126;
    header[2] = length >> 8;
    header[3] = length & 0xff;
  } else {
    header[1] = maskBit | 127;
    new DataView(header.buffer, 2, 8).setBigUint64(0, BigInt(length));
  }
  if (!masked) return _join(header, payload);
  const key = crypto.getRandomValues(new Uint8Array(4));
  header.set(key, size);
  return _join(header, payload.map((byte, i) => byte ^ key[i & 3]));
}

function _join(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function _closeCode(payload: Uint8Array): number {
  return (payload[0] << 8) | payload[1];
}

const _LIMITS: WebSocketLimits = { maxTextBytes: 1024, maxBinaryBytes: 1 << 20 };

Deno.test("websocket server: the node's client both ways, text and binary, small and at the limit", async () => {
  const { server, port, sockets } = _server(_LIMITS, (socket) => {
    socket.onmessage = (event) => {
      if (typeof event.data === "string") socket.send(event.data.toUpperCase());
      else socket.send(new Uint8Array(event.data).map((b) => b ^ 0xff));
    };
  });
  const client = new WebSocketClient(`ws://127.0.0.1:${port}/link`, {
    maxMessageBytes: 2 << 20,
  });
  const answers: (string | number)[] = [];
  const done = Promise.withResolvers<void>();
  client.onmessage = (event) => {
    if (typeof event.data === "string") answers.push(event.data);
    else {
      const bytes = new Uint8Array(event.data);
      answers.push(bytes.length, bytes[0], bytes[bytes.length - 1]);
    }
    if (answers.length === 7) done.resolve();
  };
  await new Promise<void>((resolve) => (client.onopen = resolve));
  client.send("hello");
  client.send(new Uint8Array([1, 2, 3]));
  const large = new Uint8Array(1 << 20).fill(7);
  large[large.length - 1] = 9;
  client.send(large);
  await done.promise;
  assert.deepEqual(answers, ["HELLO", 3, 254, 252, 1 << 20, 248, 246]);
  const closed = new Promise<WebSocketCloseInfo>((resolve) => (client.onclose = resolve));
  client.close(1000, "done");
  assert.deepEqual(await closed, { code: 1000, reason: "", wasClean: true });
  assert.deepEqual(await sockets[0].seen.closed, { code: 1000, reason: "done", wasClean: true });
  await server.shutdown();
});

Deno.test("websocket server: a message over the limit is refused at its header (1009), its payload never sent", async () => {
  const { server, port, sockets } = _server(_LIMITS);
  // Only the header of a 60 MiB binary frame: the answer comes without its payload.
  const peer = await _RawPeer.open(port);
  await peer.write(_clientFrame(2, new Uint8Array(0), { declared: 60 << 20 }));
  const close = await peer.frame();
  assert.equal(close?.opcode, 8);
  assert.equal(_closeCode(close!.payload), 1009);
  assert.ok(await peer.ended());
  peer.close();
  const { seen } = sockets[0];
  assert.equal((await seen.closed).code, 1009);
  assert.deepEqual(seen.errors.map((e) => e.code), [1009]);
  assert.match(
    seen.errors[0].message,
    /binary message of 62914560 bytes or more, over the 1048576/,
  );
  assert.deepEqual(seen.messages, []);

  // Text has its own limit: 1025 bytes of text are refused where binary would pass.
  const text = await _RawPeer.open(port);
  await text.write(_clientFrame(1, new Uint8Array(0), { declared: 1025 }));
  assert.equal(_closeCode((await text.frame())!.payload), 1009);
  text.close();

  // A fragmented message: its running total counts, the second fragment refused at its header.
  const fragments = await _RawPeer.open(port);
  await fragments.write(_clientFrame(2, new Uint8Array(600 * 1024), { fin: false }));
  await fragments.write(_clientFrame(0, new Uint8Array(0), { declared: 600 * 1024 }));
  assert.equal(_closeCode((await fragments.frame())!.payload), 1009);
  fragments.close();
  assert.equal((await sockets[2].seen.closed).code, 1009);
  assert.deepEqual(sockets[2].seen.messages, []);
  // A 64-bit length past 2^53 is over any limit too.
  const huge = await _RawPeer.open(port);
  const header = _clientFrame(2, new Uint8Array(0), { declared: 70000 });
  new DataView(header.buffer, 2, 8).setBigUint64(0, 1n << 62n);
  await huge.write(header);
  assert.equal(_closeCode((await huge.frame())!.payload), 1009);
  huge.close();
  await server.shutdown();
});

Deno.test("websocket server: fragments joined, ping answered, the peer's close echoed", async () => {
  const { server, port, sockets } = _server(_LIMITS);
  const peer = await _RawPeer.open(port);
  await peer.write(_clientFrame(1, _encoder.encode("hel"), { fin: false }));
  // A ping between fragments is answered at once.
  await peer.write(_clientFrame(9, _encoder.encode("p1")));
  const pong = await peer.frame();
  assert.deepEqual([pong?.opcode, new TextDecoder().decode(pong?.payload)], [10, "p1"]);
  await peer.write(_clientFrame(0, _encoder.encode("lo"), { fin: false }));
  await peer.write(_clientFrame(0, _encoder.encode(" world")));
  await peer.write(_clientFrame(2, new Uint8Array([5, 6]), { fin: false }));
  await peer.write(_clientFrame(0, new Uint8Array([7])));
  const reason = _encoder.encode("bye");
  await peer.write(_clientFrame(8, _join(new Uint8Array([0x0f, 0xa0]), reason)));
  const echo = await peer.frame();
  assert.deepEqual([echo?.opcode, _closeCode(echo!.payload)], [8, 4000]);
  assert.ok(await peer.ended());
  peer.close();
  const { seen } = sockets[0];
  assert.deepEqual(await seen.closed, { code: 4000, reason: "bye", wasClean: true });
  assert.equal(seen.messages[0], "hello world");
  assert.deepEqual([...new Uint8Array(seen.messages[1] as ArrayBuffer)], [5, 6, 7]);
  await server.shutdown();
});

Deno.test("websocket server: protocol violations close with 1002 or 1007", async () => {
  const { server, port, sockets } = _server(_LIMITS);
  const cases: [Uint8Array, number, RegExp][] = [
    [_clientFrame(2, new Uint8Array(3), { masked: false }), 1002, /unmasked/],
    [_clientFrame(0, new Uint8Array(3)), 1002, /continuation frame without a message/],
    [_clientFrame(3, new Uint8Array(3)), 1002, /unknown opcode 3/],
    [_clientFrame(9, new Uint8Array(3), { fin: false }), 1002, /fragmented control/],
    [_clientFrame(9, new Uint8Array(126)), 1002, /control frame over 125/],
    [_clientFrame(1, new Uint8Array([0xc3, 0x28])), 1007, /not UTF-8/],
  ];
  for (const [index, [frame, code, message]] of cases.entries()) {
    const peer = await _RawPeer.open(port);
    await peer.write(frame);
    const close = await peer.frame();
    assert.equal(_closeCode(close!.payload), code, String(message));
    assert.ok(await peer.ended());
    peer.close();
    const { seen } = sockets[index];
    assert.equal((await seen.closed).code, code);
    assert.match(seen.errors[0].message, message);
  }
  await server.shutdown();
});

Deno.test("websocket server: the server's close is sent, echoed and reported", async () => {
  const { server, port, sockets } = _server(_LIMITS, (socket) => {
    socket.onopen = () => socket.close(4010, "slot discarded");
  });
  const peer = await _RawPeer.open(port);
  const close = await peer.frame();
  assert.equal(_closeCode(close!.payload), 4010);
  assert.equal(new TextDecoder().decode(close!.payload.subarray(2)), "slot discarded");
  await peer.write(_clientFrame(8, close!.payload.subarray(0, 2)));
  assert.ok(await peer.ended());
  peer.close();
  assert.deepEqual(await sockets[0].seen.closed, { code: 4010, reason: "", wasClean: true });
  await server.shutdown();
});

Deno.test("websocket server: a close the peer never answers is given up (1006)", async () => {
  const { server, port, sockets } = _server(_LIMITS, (socket) => {
    socket.onopen = () => socket.close(1000, "done");
  });
  const peer = await _RawPeer.open(port);
  assert.equal((await peer.frame())?.opcode, 8);
  // No answer: the server stops waiting and closes the connection.
  assert.ok(await peer.ended());
  peer.close();
  assert.deepEqual(await sockets[0].seen.closed, { code: 1006, reason: "", wasClean: false });
  assert.deepEqual(sockets[0].seen.errors, []);
  await server.shutdown();
});

Deno.test("websocket server: a failed connection whose peer reads nothing is closed all the same", async () => {
  const { server, port, sockets } = _server(_LIMITS, (socket) => {
    socket.onmessage = (event) => socket.send(event.data as ArrayBuffer); // echoes, unread
  });
  const peer = await _RawPeer.open(port);
  const chunk = new Uint8Array(512 * 1024);
  for (let i = 0; i < 32; i++) await peer.write(_clientFrame(2, chunk));
  // An unmasked frame fails the connection (1002); the close frame queues behind 16 MiB of
  // echoes the peer never reads, so only the close wait can end the connection.
  await peer.write(_clientFrame(2, new Uint8Array(1), { masked: false }));
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    sockets[0].seen.closed.then((info) => info.code),
    new Promise<string>((resolve) => timer = setTimeout(() => resolve("still open"), 10_000)),
  ]);
  clearTimeout(timer);
  peer.close();
  assert.equal(outcome, 1002);
  await server.shutdown();
});

Deno.test("websocket server: a silent peer is pinged, then closed with 1001", async () => {
  const { server, port, sockets } = _server({ ..._LIMITS, idleTimeoutMs: 100 });
  const peer = await _RawPeer.open(port);
  const ping = await peer.frame();
  assert.equal(ping?.opcode, 9);
  // No pong: the connection is closed.
  const close = await peer.frame();
  assert.deepEqual([close?.opcode, _closeCode(close!.payload)], [8, 1001]);
  assert.ok(await peer.ended());
  peer.close();
  assert.equal((await sockets[0].seen.closed).code, 1001);
  await server.shutdown();
});

Deno.test("websocket server: handshakes it does not take are refused with their status", async () => {
  const { server, port } = _server(_LIMITS);
  const cases: [string, number, RegExp][] = [
    ["upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\n", 400, /Key/],
    [
      "upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 8\r\n" +
      "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
      426,
      /Version/,
    ],
    [
      "upgrade: h2c\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\n" +
      "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
      400,
      /Upgrade header/,
    ],
  ];
  for (const [fields, status, message] of cases) {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    await conn.write(_encoder.encode(`GET /link HTTP/1.1\r\nhost: x\r\n${fields}\r\n`));
    let text = "";
    const buffer = new Uint8Array(4096);
    for (let n; (n = await conn.read(buffer)) !== null;) {
      text += new TextDecoder().decode(buffer.subarray(0, n));
    }
    conn.close();
    assert.match(text, new RegExp(`^HTTP/1\\.1 ${status} `));
    assert.match(text, message);
  }
  await server.shutdown();
});

Deno.test("websocket server: upgradeWebSocket", async () => {
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) => {
      const { socket, response } = upgradeWebSocket(request, {
        maxTextBytes: 1024,
        maxBinaryBytes: 1024,
      });
      socket.onmessage = (event) => socket.send(`echo ${event.data}`);
      return Promise.resolve(response);
    },
  });
  const client = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
  const answer = await new Promise<string>((resolve) => {
    client.onopen = () => client.send("hello");
    client.onmessage = (event) => resolve(event.data as string);
  });
  if (answer !== "echo hello") throw new Error(answer);
  const closed = new Promise((resolve) => (client.onclose = resolve));
  client.close(1000, "done");
  await closed;
  await server.shutdown();
});
