// Large request bodies (≥ 8 MiB) are read into reused buffers and their blobs hashed on worker
// threads while they arrive (protocol/part_digests.ts): results, error texts and error
// precedence are the same as for small bodies, and the request reports where its time went.
import assert from "node:assert/strict";
import { sha256Hex } from "../protocol/hash.ts";
import { Client, Program } from "../mod.ts";
import { appInternals } from "../server/app.ts";
import { multipartBody, postProgram, startServer } from "./_server.ts";
import { randomBytes } from "./_bytes.ts";

const _LENGTH_SOURCE =
  "def length(a, b):\n    return [len(a), len(b), a[:3].hex(), b[-3:].hex()]\n";

function lengthProgram(a: Uint8Array, b: Uint8Array): string {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: _LENGTH_SOURCE });
  const fn = program.getFunction({ module: mod, name: "length" });
  const args = [
    program.upload({ kind: "bytes", value: a }),
    program.upload({ kind: "bytes", value: b }),
  ];
  program.return_({ key: "n", value: program.run({ fn, args }) });
  return program.toJson();
}

/** The whole `/execute` body of {@linkcode lengthProgram} with both blobs. */
function lengthBody(a: Uint8Array, b: Uint8Array) {
  return multipartBody([
    { name: "program", contentType: "application/json", body: lengthProgram(a, b) },
    { name: `blob:${sha256Hex(a)}`, contentType: "application/octet-stream", body: a },
    { name: `blob:${sha256Hex(b)}`, contentType: "application/octet-stream", body: b },
  ]);
}

Deno.test("server: large bodies are hashed off-thread with the same results and errors", async () => {
  const server = await startServer();
  try {
    const a = randomBytes(6 << 20);
    const b = randomBytes(5 << 20);
    const ha = sha256Hex(a);
    const hb = sha256Hex(b);
    const ok = await postProgram(server.url, lengthProgram(a, b), {
      blobs: { [ha]: a, [hb]: b },
    });
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    const value = (ok.json.results as Record<string, { value: { value: unknown }[] }>).n.value
      .map((v) => v.value);
    assert.deepEqual(value, [
      a.length,
      b.length,
      [...a.subarray(0, 3)].map((x) => x.toString(16).padStart(2, "0")).join(""),
      [...b.subarray(-3)].map((x) => x.toString(16).padStart(2, "0")).join(""),
    ]);
    const accepted = server.events.find((e) => e.event === "request_accepted")!;
    for (const key of ["receive_ms", "parse_ms", "store_ms"]) {
      assert.equal(typeof accepted[key], "number", key);
    }
    // Both blobs were written by the hashing threads while they arrived, and taken over.
    assert.equal(accepted.spooled_blobs, 2);
    const blobDir = appInternals(server.app).blobDir!;
    assert.deepEqual(await Deno.readFile(`${blobDir}/${ha}`), a);
    assert.deepEqual(await Deno.readFile(`${blobDir}/${hb}`), b);
    // Spool files nobody took are deleted just after the response (waited for here).
    const leftovers = async () => {
      const list = () =>
        [...Deno.readDirSync(blobDir)].map((e) => e.name).filter((n) => n.startsWith("."));
      for (let i = 0; i < 100 && list().length > 0; i++) {
        await new Promise((r) => setTimeout(r, 20));
      }
      return list();
    };
    assert.deepEqual(await leftovers(), []);

    // A corrupted blob: upstream's message, naming the declared and the computed digest.
    const bad = b.slice();
    bad[4242] ^= 0xff;
    const mismatch = await postProgram(server.url, lengthProgram(a, b), {
      blobs: { [ha]: a, [hb]: bad },
    });
    assert.equal(mismatch.status, 400);
    const error = mismatch.json.error as { kind: string; message: string };
    assert.equal(error.kind, "parse");
    assert.equal(
      error.message,
      `blob hash mismatch: declared ${hb}, computed ${sha256Hex(bad)}`,
    );
    // Nothing of the corrupted upload is kept: no blob under the declared digest (b is cached
    // already, so look for the corrupted bytes' own digest), no spool file left behind.
    assert.equal(await Deno.stat(`${blobDir}/${sha256Hex(bad)}`).catch(() => null), null);
    assert.deepEqual(await leftovers(), []);
    // The hash check still wins over a malformed program, as in upstream's order.
    const both = await postProgram(server.url, "{not json", { blobs: { [ha]: a, [hb]: bad } });
    assert.equal(both.status, 400);
    assert.match((both.json.error as { message: string }).message, /^blob hash mismatch/);
  } finally {
    await server.stop();
  }
});

Deno.test("server: a large result streams from its part file in several reads, bytes intact", async () => {
  const server = await startServer();
  try {
    const program = new Program();
    const mod = program.upload({
      kind: "module",
      source: "def big():\n    return bytes(range(256)) * (9 * 4096 + 7)\n",
    });
    const fn = program.getFunction({ module: mod, name: "big" });
    program.return_({ key: "b", value: program.run({ fn }) });
    await using client = new Client(server.url);
    const result = await client.execute(program);
    assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
    const data = result.get<Uint8Array>("b");
    assert.equal(data.length, 256 * (9 * 4096 + 7)); // over 9 MiB: three 4 MiB file reads
    for (let i = 0; i < data.length; i += 4093) assert.equal(data[i], i % 256);
  } finally {
    await server.stop();
  }
});

Deno.test("server: a client hanging up halfway through a large upload leaves no spool, the server serves on", async () => {
  const server = await startServer();
  try {
    const a = randomBytes(6 << 20);
    const b = randomBytes(6 << 20);
    const program = lengthProgram(a, b);
    const { body, contentType } = lengthBody(a, b);
    const blobDir = appInternals(server.app).blobDir!;
    const spools = () =>
      [...Deno.readDirSync(blobDir)].map((e) => e.name).filter((n) => n.startsWith(".spool-"));
    const { hostname, port } = new URL(server.url);
    for (const cut of [body.length >> 1, body.length - 100]) { // b just begun; b nearly done
      const conn = await Deno.connect({ hostname, port: Number(port) });
      const head = `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: ${contentType}\r\n` +
        `content-length: ${body.length}\r\n\r\n`;
      await conn.write(new TextEncoder().encode(head));
      for (let at = 0; at < cut;) at += await conn.write(body.subarray(at, cut));
      // Wait until the server has begun spooling this body, then hang up.
      for (let i = 0; i < 200 && spools().length === 0; i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.notEqual(spools().length, 0, "the upload was never spooled");
      conn.close();
      for (let i = 0; i < 200 && spools().length > 0; i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.deepEqual(spools(), [], `spool files left after a hang-up at byte ${cut}`);
      // Nothing of the unfinished upload went into the store.
      assert.equal(await Deno.stat(`${blobDir}/${sha256Hex(b)}`).catch(() => null), null);
    }
    // The server serves on, with the same blobs, in full.
    const ok = await postProgram(server.url, program, {
      blobs: { [sha256Hex(a)]: a, [sha256Hex(b)]: b },
    });
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    assert.equal(
      server.events.filter((e) => e.event === "request_accepted").length,
      1,
      "a cut upload was accepted",
    );
  } finally {
    await server.stop();
  }
});

Deno.test("server: bodies only declared large get no buffers: past four at once, a body is held as it arrives", async () => {
  const server = await startServer();
  const stalled: Deno.TcpConn[] = [];
  try {
    const { hostname, port } = new URL(server.url);
    const received = () => server.events.filter((e) => e.event === "request_received").length;
    // Four uploads that declare 64 MiB and send nothing: each holds a place in the in-place path.
    for (let i = 0; i < 4; i++) {
      const conn = await Deno.connect({ hostname, port: Number(port) });
      await conn.write(new TextEncoder().encode(
        `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n` +
          `content-length: ${64 << 20}\r\n\r\n`,
      ));
      stalled.push(conn);
    }
    for (let i = 0; i < 300 && received() < 4; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(received(), 4);
    const upload = async () => {
      const a = randomBytes(6 << 20);
      const b = randomBytes(5 << 20);
      const ok = await postProgram(server.url, lengthProgram(a, b), {
        blobs: { [sha256Hex(a)]: a, [sha256Hex(b)]: b },
      });
      assert.equal(ok.status, 200, JSON.stringify(ok.json));
      const n = (ok.json.results as Record<string, { value: { value: unknown }[] }>).n.value;
      assert.deepEqual(n.slice(0, 2).map((v) => v.value), [a.length, b.length]);
      const accepted = server.events.filter((e) => e.event === "request_accepted").at(-1)!;
      return accepted.spooled_blobs;
    };
    // A fifth large body is held as it arrives (nothing spooled on the way), with the same result.
    assert.equal(await upload(), 0);
    // Once the declared-only uploads are gone, large bodies are read in place again.
    for (const conn of stalled.splice(0)) conn.close();
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(await upload(), 2);
  } finally {
    for (const conn of stalled) conn.close();
    await server.stop();
  }
});

Deno.test("server: the connection of a large upload is kept for the next request", async () => {
  const server = await startServer();
  try {
    const a = randomBytes(6 << 20);
    const b = randomBytes(5 << 20);
    const { body, contentType } = lengthBody(a, b);
    const { hostname, port } = new URL(server.url);
    const conn = await Deno.connect({ hostname, port: Number(port) });
    try {
      let pending = new Uint8Array(0);
      // One response: its head, then exactly content-length bytes.
      const response = async () => {
        const chunk = new Uint8Array(65536);
        for (;;) {
          const text = new TextDecoder().decode(pending);
          const end = text.indexOf("\r\n\r\n");
          if (end >= 0) {
            const head = text.slice(0, end);
            const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
            if (pending.length >= end + 4 + length) {
              pending = pending.slice(end + 4 + length);
              return head;
            }
          }
          const n = await conn.read(chunk);
          if (n === null) throw new Error("the server closed the connection");
          const joined = new Uint8Array(pending.length + n);
          joined.set(pending);
          joined.set(chunk.subarray(0, n), pending.length);
          pending = joined;
        }
      };
      const write = async (bytes: Uint8Array) => {
        for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
      };
      await write(new TextEncoder().encode(
        `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: ${contentType}\r\n` +
          `content-length: ${body.length}\r\n\r\n`,
      ));
      await write(body);
      const first = await response();
      assert.match(first, /^HTTP\/1\.1 200 /);
      assert.doesNotMatch(first, /connection: close/i);
      await write(new TextEncoder().encode("GET /health HTTP/1.1\r\nhost: x\r\n\r\n"));
      assert.match(await response(), /^HTTP\/1\.1 200 /);
    } finally {
      conn.close();
    }
  } finally {
    await server.stop();
  }
});
