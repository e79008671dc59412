/**
 * The floor of one node-link hop: 256 MiB as 256 KiB binary messages under credit (window 16,
 * as link/messages.ts), between two processes on loopback, both directions:
 *
 * - node → Router: `link/websocket_client.ts` sends, a `Deno.upgradeWebSocket` server receives
 *   and gives each message's memory back at once, as the Router does (the path of a node's
 *   answer);
 * - Router → node: the server sends, our client receives (the path of a request's upload);
 *
 * and, for scale, the same bytes over a bare TCP connection. What a routed answer adds per MiB
 * cannot fall below the first row. `HOP_FRAME_KIB` sets another message size (default 256).
 *
 *   deno run -A bench/probes/websocket_hop.ts
 *
 * @module
 */
import { WebSocketClient } from "../../link/websocket_client.ts";
import { releaseBuffer } from "../../protocol/bytes.ts";

const MIB = 256;
const FRAME = Number(Deno.env.get("HOP_FRAME_KIB") ?? 256) * 1024;
const WINDOW = 16;
const FRAMES = (MIB << 20) / FRAME;

if (Deno.args[0] === "--peer") {
  // The other process: a WebSocket server (or a bare TCP listener) that receives or sends.
  const mode = Deno.args[1];
  if (mode === "tcp") {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    console.log((listener.addr as Deno.NetAddr).port);
    const conn = await listener.accept();
    conn.setNoDelay(true);
    const buffer = new Uint8Array(FRAME);
    let total = 0;
    while (total < MIB << 20) total += (await conn.read(buffer)) ?? Infinity;
    await conn.write(new Uint8Array([1]));
    conn.close();
  } else {
    const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
      const { socket, response } = Deno.upgradeWebSocket(request);
      socket.binaryType = "arraybuffer";
      if (mode === "receive") {
        const received = _receiver((text) => socket.send(text));
        socket.onmessage = (event) => {
          if (typeof event.data === "string") return;
          // As the Router does once the client's answer took the bytes (router/exchange.ts).
          releaseBuffer(new Uint8Array(event.data));
          if (received()) socket.send("done");
        };
      } else {
        const sender = _sender((bytes) => socket.send(bytes));
        socket.onmessage = (event) => sender.credit(event.data);
        socket.onopen = sender.start;
      }
      return response;
    });
    console.log(server.addr.port);
  }
} else {
  for (
    const [name, mode] of [["node → Router (answer path)", "receive"], [
      "Router → node (upload path)",
      "send",
    ], ["bare TCP socket", "tcp"]]
  ) {
    const times: number[] = [];
    for (let round = 0; round < 3; round++) times.push(await _run(mode));
    times.sort((a, b) => a - b);
    console.log(
      `${name}: ${times.map((t) => (t / MIB).toFixed(2)).join(", ")} ms/MiB (${MIB} MiB, 3 runs)`,
    );
  }
}

/** Sends FRAMES messages, never more than WINDOW ahead of the credit the receiver gave. */
function _sender(send: (bytes: Uint8Array) => void) {
  const payload = new Uint8Array(FRAME).fill(7);
  let credit = WINDOW;
  let sent = 0;
  const start = () => {
    for (; credit > 0 && sent < FRAMES; credit--, sent++) send(payload);
  };
  return { start, credit: (text: string) => (credit += Number(text), start()) };
}

/** Counts received messages, returning credit every half window; `true` once all arrived. */
function _receiver(sendCredit: (text: string) => void): () => boolean {
  let got = 0;
  let read = 0;
  return () => {
    got++;
    if (++read >= WINDOW / 2) (sendCredit(String(read)), read = 0);
    return got === FRAMES;
  };
}

async function _run(mode: string): Promise<number> {
  const peer = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", import.meta.filename!, "--peer", mode],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = peer.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const port = Number((await reader.read()).value!.trim());
  reader.releaseLock();
  const start = performance.now();
  if (mode === "tcp") {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    conn.setNoDelay(true);
    const payload = new Uint8Array(FRAME).fill(7);
    for (let i = 0; i < FRAMES; i++) {
      for (let at = 0; at < FRAME;) at += await conn.write(payload.subarray(at));
    }
    await conn.read(new Uint8Array(1));
    conn.close();
  } else {
    const socket = new WebSocketClient(`ws://127.0.0.1:${port}/`, { maxMessageBytes: FRAME + 64 });
    await new Promise<void>((resolve, reject) => {
      socket.onerror = (event) => reject(new Error(event.message));
      if (mode === "receive") {
        const sender = _sender((bytes) => socket.send(bytes));
        socket.onopen = sender.start;
        socket.onmessage = (event) => {
          if (event.data === "done") resolve();
          else sender.credit(event.data as string);
        };
      } else {
        const received = _receiver((text) => socket.send(text));
        socket.onmessage = (event) => {
          if (typeof event.data !== "string" && received()) resolve();
        };
      }
    });
    socket.close();
  }
  const elapsed = performance.now() - start;
  peer.kill();
  await peer.status;
  return elapsed;
}
