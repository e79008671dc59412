/**
 * What the host itself allows for the cache-miss resend, measured in the bench's process so the
 * rows sit beside the resend they bound: moving 128 MiB over a bare loopback socket, reading a
 * 128 MiB request body behind `Deno.serve` (the server's HTTP layer, nothing else), and SHA-256
 * of one 64 MiB stream (`node:crypto`, as the server's hashing threads use). The probes
 * `probes/loopback.ts` and `probes/serve_body.ts` print the same transfers one by one.
 *
 * @module
 */
import { createHash } from "node:crypto";

/** 128 MiB, the two 64 MiB inputs of the resend row. */
export const FLOOR_BYTES = 128 << 20;

/**
 * Milliseconds per transfer of `data` over a bare loopback socket (both ends in this process;
 * the reader reads straight into one buffer), `rounds` times on one connection.
 */
export async function loopbackTransfers(data: Uint8Array, rounds: number): Promise<number[]> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  const target = new Uint8Array(data.length);
  const reading = (async () => {
    using conn = await listener.accept();
    for (let k = 0; k < rounds; k++) {
      let got = 0;
      while (got < target.length) {
        const n = await conn.read(target.subarray(got));
        if (n === null) throw new Error(`connection closed after ${got} bytes`);
        got += n;
      }
      await conn.write(new Uint8Array([1]));
    }
  })();
  const times: number[] = [];
  try {
    using conn = await Deno.connect({ hostname: "127.0.0.1", port });
    for (let k = 0; k < rounds; k++) {
      const start = performance.now();
      await _writeAll(conn, data);
      if (await conn.read(new Uint8Array(1)) !== 1) throw new Error("no acknowledgement");
      times.push(performance.now() - start);
    }
    await reading;
  } finally {
    listener.close();
  }
  return times;
}

/** Reads a request's body of `size` bytes somehow; resolves to how many reads it took. */
export type BodyRead = (request: Request, size: number) => Promise<number>;

/**
 * Milliseconds per `POST` of `data` to a `Deno.serve` handler that only reads the body (by
 * default with a BYOB reader into one reused buffer: what the server's receive does, without
 * scanning or hashing), from the raw write of the request to the response's first bytes; one
 * connection per round. Also returns the handler's read count per round.
 */
export async function serveBodyTransfers(
  data: Uint8Array,
  rounds: number,
  read: BodyRead = byobRead(),
): Promise<{ ms: number[]; reads: number[] }> {
  const size = data.length;
  const reads: number[] = [];
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    reads.push(await read(req, size));
    return new Response("ok");
  });
  const head = new TextEncoder().encode(
    `POST / HTTP/1.1\r\nhost: x\r\ncontent-length: ${size}\r\nconnection: close\r\n\r\n`,
  );
  const ms: number[] = [];
  try {
    for (let k = 0; k < rounds; k++) {
      using conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
      const start = performance.now();
      await _writeAll(conn, head);
      await _writeAll(conn, data);
      const answer = new Uint8Array(512);
      const n = await conn.read(answer);
      ms.push(performance.now() - start);
      const text = new TextDecoder().decode(answer.subarray(0, n ?? 0));
      if (!text.startsWith("HTTP/1.1 200") || !text.endsWith("ok")) {
        throw new Error(`unexpected answer: ${text}`);
      }
    }
  } finally {
    await server.shutdown();
  }
  return { ms, reads };
}

/** A {@linkcode BodyRead} with a BYOB reader into one buffer reused across requests. */
export function byobRead(): BodyRead {
  let target = new ArrayBuffer(0);
  return async (request, size) => {
    // BYOB reads hand back a new ArrayBuffer object over the same memory: keep that one.
    let buffer = target.byteLength >= size ? target : new ArrayBuffer(size);
    const reader = request.body!.getReader({ mode: "byob" });
    let offset = 0;
    let reads = 0;
    while (offset < size) {
      const { value, done } = await reader.read(
        new Uint8Array(buffer, offset, Math.min(size - offset, 8 << 20)),
      );
      if (value) buffer = value.buffer as ArrayBuffer;
      if (done || !value) break;
      offset += value.length;
      reads++;
    }
    target = buffer;
    if (offset !== size) throw new Error(`short body: ${offset} of ${size} bytes`);
    return reads;
  };
}

/** Milliseconds per SHA-256 of `data` (one stream, fed in 4 MiB pieces), `rounds` times. */
export function sha256Times(data: Uint8Array, rounds: number): number[] {
  const times: number[] = [];
  for (let k = 0; k < rounds; k++) {
    const start = performance.now();
    const hash = createHash("sha256");
    for (let at = 0; at < data.length; at += 4 << 20) {
      hash.update(data.subarray(at, at + (4 << 20)));
    }
    hash.digest();
    times.push(performance.now() - start);
  }
  return times;
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}
