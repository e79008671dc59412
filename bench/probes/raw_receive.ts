/**
 * What the server's receive phase of a resend would cost without `Deno.serve`: a 128 MiB
 * `/execute` body (two 64 MiB blobs) is received the way the server receives it — one pooled
 * buffer, the delimiter scan, the shared mirror, a hashing and a spool thread per blob — once
 * behind `Deno.serve` (BYOB reads, `server/request_body.ts`) and once straight from a socket
 * (`conn.read` into the same buffer). Each line: from the first read to the last one, and to
 * every digest and spool file done. The client is a raw socket in this process, as in `serve_body.ts` and `loopback.ts`.
 *
 *   deno run -A bench/probes/raw_receive.ts
 *
 * @module
 */
import { HashThreads } from "../../protocol/hash_threads.ts";
import { PartDigests } from "../../protocol/part_digests.ts";
import { encodeMultipartChunks } from "../../protocol/multipart_encode.ts";
import { readRequestBody } from "../../http/request_body.ts";
import { randomFloats } from "../_programs.ts";

const blobs = [randomFloats(16 << 20), randomFloats(16 << 20)].map((f) => new Uint8Array(f.buffer));
const encoded = encodeMultipartChunks([
  { name: "program", contentType: "application/json", body: new TextEncoder().encode("{}") },
  ...blobs.map((body, i) => ({
    name: `blob:${String(i).repeat(64)}`,
    contentType: "application/octet-stream",
    body,
  })),
]);
const headers = new Headers({ "content-type": encoded.contentType });
const threads = new HashThreads(8);
threads.warm();
const spoolDir = await Deno.makeTempDir({ dir: "/dev/shm" });
let buffer = new ArrayBuffer(encoded.length);
const mirror = new SharedArrayBuffer(encoded.length);
const observe = () =>
  PartDigests.forMultipart(headers, threads, {
    mirror: () => mirror,
    spool: (header) =>
      header.includes('name="blob:') ? `${spoolDir}/${crypto.randomUUID()}` : undefined,
  })!;
/** Waits for every digest and spool, checks the spools and deletes them. */
async function finish(digests: PartDigests, body: Uint8Array): Promise<void> {
  await digests.settle();
  const files = [...Deno.readDirSync(spoolDir)];
  if (files.length !== 2) throw new Error(`expected 2 spool files, found ${files.length}`);
  await digests.discardSpooled();
  if (body.length !== encoded.length) throw new Error(`received ${body.length} bytes`);
}

async function send(port: number, head: string): Promise<Deno.TcpConn> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await conn.write(new TextEncoder().encode(head));
  for (const chunk of encoded.chunks) {
    let off = 0;
    while (off < chunk.length) off += await conn.write(chunk.subarray(off));
  }
  return conn;
}
const head = (connection: string) =>
  `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: ${encoded.contentType}\r\n` +
  `content-length: ${encoded.length}\r\nconnection: ${connection}\r\n\r\n`;

// Behind Deno.serve.
let served = { read: 0, done: 0 };
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
  const start = performance.now();
  let digests: PartDigests | undefined;
  const received = await readRequestBody(request, encoded.length, {
    take: () => buffer,
    observer: () => digests = observe(),
  });
  buffer = received!.body.buffer as ArrayBuffer;
  const read = performance.now() - start;
  await finish(digests!, received!.body);
  served = { read, done: performance.now() - start };
  return new Response("ok");
});
for (let k = 0; k < 5; k++) {
  const conn = await send(server.addr.port, head("close"));
  await conn.read(new Uint8Array(1024));
  conn.close();
  console.log(
    `Deno.serve (BYOB): 128 MiB read in ${served.read.toFixed(1)} ms, hashed and spooled in ${
      served.done.toFixed(1)
    } ms`,
  );
}
await server.shutdown();

// Straight from the socket.
const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
const port = (listener.addr as Deno.NetAddr).port;
for (let k = 0; k < 5; k++) {
  const sending = send(port, head("close"));
  const conn = await listener.accept();
  // The head (small) first, then the body in place, as request_body.ts does behind Deno.serve.
  const first = new Uint8Array(16384);
  let got = 0;
  let end = -1;
  while (end < 0) {
    const n = await conn.read(first.subarray(got));
    if (n === null) throw new Error("closed in the head");
    got += n;
    end = new TextDecoder("latin1").decode(first.subarray(0, got)).indexOf("\r\n\r\n");
  }
  const start = performance.now();
  const body = new Uint8Array(buffer, 0, encoded.length);
  const digests = observe();
  let offset = got - (end + 4);
  body.set(first.subarray(end + 4, got));
  await digests.update(body, offset);
  while (offset < body.length) {
    const n = await conn.read(body.subarray(offset, Math.min(body.length, offset + (4 << 20))));
    if (n === null) break;
    offset += n;
    await digests.update(body, offset);
  }
  const read = performance.now() - start;
  await finish(digests, body.subarray(0, offset));
  const done = performance.now() - start;
  await conn.write(new TextEncoder().encode("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
  conn.close();
  (await sending).close();
  console.log(
    `raw socket:        128 MiB read in ${read.toFixed(1)} ms, hashed and spooled in ${
      done.toFixed(1)
    } ms`,
  );
}
listener.close();
threads.close();
await Deno.remove(spoolDir, { recursive: true });
