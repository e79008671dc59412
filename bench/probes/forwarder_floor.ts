/**
 * The floor under a Router's large answer, without any Router code: a stand-alone forwarder takes
 * 256 MiB from a "node" (our `WebSocketClient`, 256 KiB binary messages under a credit window of
 * 16, as the node link) and streams it to a "client" (a raw socket reading a chunked answer), the
 * three in separate processes on loopback. Prints per run the wall time and the forwarder's CPU
 * per MiB and its minor page faults per MiB, four runs per way:
 *
 * - `serve`: `Deno.serve` takes the node's WebSocket (`Deno.upgradeWebSocket`) and answers the
 *   client with a `ReadableStream`, each message's memory given back once the answer took it, as
 *   router/forward.ts does;
 * - `raw`: no `Deno.serve`: one `Deno.listen` socket each way, the node's frames parsed and
 *   unmasked here and written to the client as HTTP chunks.
 *
 *   deno run -A bench/probes/forwarder_floor.ts [serve|raw]
 *
 * @module
 */
import { WebSocketClient } from "../../http/websocket_client.ts";
import { maskInto } from "../../http/websocket_mask.ts";
import { releaseBuffer } from "../../protocol/bytes.ts";

const MIB = 256;
const FRAME = 256 * 1024;
const FRAMES = (MIB << 20) / FRAME;
const WINDOW = 16;
const RUNS = 4;
const _encoder = new TextEncoder();

const [role, portArg] = Deno.args;
if (role === "--node") await _node(Number(portArg));
else if (role === "--client") await _client(Number(portArg));
else {
  for (const way of role ? [role] : ["serve", "raw"]) {
    const rows = way === "raw" ? await _rawForwarder() : await _serveForwarder();
    console.log(`${way}: ${rows.join("; ")} (wall ms/MiB, forwarder CPU ms/MiB, faults/MiB)`);
  }
}

/** Sends FRAMES messages, never more than WINDOW ahead of the credit given back. */
async function _node(port: number): Promise<never> {
  const socket = new WebSocketClient(`ws://127.0.0.1:${port}/node`, { maxMessageBytes: 1 << 20 });
  const payload = new Uint8Array(FRAME).fill(7);
  let credit = WINDOW;
  let sent = 0;
  const send = () => {
    for (; credit > 0 && sent < FRAMES; credit--, sent++) socket.send(payload);
  };
  socket.onopen = send;
  socket.onmessage = (event) => (credit += Number(event.data), send());
  return await new Promise<never>(() => {});
}

/** Asks for the answer and reads it to its end. */
async function _client(port: number): Promise<void> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await conn.write(_encoder.encode("GET /answer HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"));
  const buffer = new Uint8Array(1 << 20);
  let received = 0;
  for (let n = await conn.read(buffer); n !== null; n = await conn.read(buffer)) received += n;
  if (received < MIB << 20) throw new Error(`short answer: ${received} bytes`);
}

function _spawn(role: string, port: number): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", import.meta.filename!, role, String(port)],
  }).spawn();
}

/** This process's CPU ms and minor faults, from /proc. */
function _usage(): [number, number] {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return [(Number(fields[11]) + Number(fields[12])) * 10, Number(fields[7])];
}

/** Times `forward` (the client's whole answer) and formats one run's figures. */
async function _measure(port: number, forward: () => Promise<void>): Promise<string> {
  const [cpu, faults] = _usage();
  const start = performance.now();
  const client = _spawn("--client", port);
  await forward();
  if (!(await client.status).success) throw new Error("the client failed");
  const wall = performance.now() - start;
  const [cpuAfter, faultsAfter] = _usage();
  return [wall / MIB, (cpuAfter - cpu) / MIB, (faultsAfter - faults) / MIB]
    .map((value, i) => value.toFixed(i === 2 ? 0 : 2)).join(" / ");
}

async function _serveForwarder(): Promise<string[]> {
  let queue: Uint8Array[] = [];
  let wake: (() => void) | null = null;
  let linked: (socket: WebSocket) => void = () => {};
  let answered: () => void = () => {};
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    if (new URL(request.url).pathname === "/node") {
      const { socket, response } = Deno.upgradeWebSocket(request);
      socket.binaryType = "arraybuffer";
      socket.onmessage = (event) => {
        queue.push(new Uint8Array(event.data));
        wake?.();
      };
      socket.onopen = () => linked(socket);
      return response;
    }
    let taken = 0;
    let read = 0;
    let handed: Uint8Array | null = null;
    return new Response(
      new ReadableStream<Uint8Array>({
        async pull(controller) {
          if (handed) releaseBuffer(handed);
          if (taken === FRAMES) return (controller.close(), answered());
          while (queue.length === 0) await new Promise<void>((resolve) => (wake = resolve));
          handed = queue.shift()!;
          taken++;
          if (++read === WINDOW / 2) (node!.send(String(read)), read = 0);
          controller.enqueue(handed);
        },
      }, { highWaterMark: 0 }),
    );
  });
  let node: WebSocket | null = null;
  const rows: string[] = [];
  for (let run = 0; run < RUNS; run++) {
    const opened = new Promise<WebSocket>((resolve) => (linked = resolve));
    const sender = _spawn("--node", server.addr.port);
    node = await opened;
    const done = new Promise<void>((resolve) => (answered = resolve));
    rows.push(await _measure(server.addr.port, () => done));
    sender.kill();
    await sender.status;
    queue = [];
  }
  await server.shutdown();
  return rows;
}

async function _rawForwarder(): Promise<string[]> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  const rows: string[] = [];
  for (let run = 0; run < RUNS; run++) {
    const sender = _spawn("--node", port);
    const node = await listener.accept();
    const buffer = new Uint8Array(4 << 20);
    let have = await _acceptWebSocket(node, buffer);
    rows.push(
      await _measure(port, async () => {
        const client = await listener.accept();
        await client.read(new Uint8Array(4096)); // its request
        await _writeAll(
          client,
          _encoder.encode(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
          ),
        );
        const chunk = new Uint8Array(FRAME + 32);
        const key = new Uint8Array(4);
        let frames = 0;
        let read = 0;
        while (frames < FRAMES) {
          have += (await node.read(buffer.subarray(have))) ?? 0;
          let at = 0;
          // Client frames of this size: 0x82, 0xFF, 8 length bytes, 4 key bytes, the payload.
          for (;;) {
            if (have - at < 14) break;
            const length = new DataView(buffer.buffer, at + 2, 8).getUint32(4);
            if (have - at < 14 + length) break;
            key.set(buffer.subarray(at + 10, at + 14));
            const head = _encoder.encode(`${length.toString(16)}\r\n`);
            chunk.set(head);
            maskInto(buffer.subarray(at + 14, at + 14 + length), key, chunk.subarray(head.length));
            chunk.set([13, 10], head.length + length);
            await _writeAll(client, chunk.subarray(0, head.length + length + 2));
            at += 14 + length;
            frames++;
            if (++read === WINDOW / 2) (await _writeAll(node, _textFrame(String(read))), read = 0);
          }
          buffer.copyWithin(0, at, have);
          have -= at;
        }
        await _writeAll(client, _encoder.encode("0\r\n\r\n"));
        client.close();
      }),
    );
    sender.kill();
    await sender.status;
    node.close();
  }
  listener.close();
  return rows;
}

/** Answers the node's WebSocket handshake; returns how many bytes after it are in `buffer`. */
async function _acceptWebSocket(conn: Deno.Conn, buffer: Uint8Array): Promise<number> {
  let have = 0;
  for (;;) {
    have += (await conn.read(buffer.subarray(have))) ?? 0;
    const text = new TextDecoder().decode(buffer.subarray(0, have));
    const end = text.indexOf("\r\n\r\n");
    if (end < 0) continue;
    const key = /sec-websocket-key: *(\S+)/i.exec(text)![1];
    const digest = await crypto.subtle.digest(
      "SHA-1",
      _encoder.encode(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"),
    );
    const accept = btoa(String.fromCharCode(...new Uint8Array(digest)));
    await _writeAll(
      conn,
      _encoder.encode(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n" +
          `sec-websocket-accept: ${accept}\r\n\r\n`,
      ),
    );
    buffer.copyWithin(0, end + 4, have);
    return have - end - 4;
  }
}

/** An unmasked text frame (a server's) of a short text. */
function _textFrame(text: string): Uint8Array {
  const bytes = _encoder.encode(text);
  return Uint8Array.of(0x81, bytes.length, ...bytes);
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}
