// Digests computed while a multipart response arrives (client/part_digests.ts), and the
// aligned placement of the first binary payload; end to end, a corrupted part is still caught.
import assert from "node:assert/strict";
import { PartDigests } from "../protocol/part_digests.ts";
import { HashThread } from "../protocol/hash_threads.ts";
import { hashesOnThread } from "../client/_shared_hash_thread.ts";
import { Client, Program, ProtocolError } from "../mod.ts";
import { encodeMultipart } from "../protocol/multipart_encode.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { parseMultipart } from "../protocol/multipart_parse.ts";
import { completed, fakeServer } from "./fixtures/protocol/fake_server.ts";
import { randomBytes } from "./_bytes.ts";

function body(parts: Uint8Array[], json = "{}") {
  return encodeMultipart([
    { name: "result", contentType: "application/json", body: new TextEncoder().encode(json) },
    ...parts.map((bytes, i) => ({
      name: `return:${i}`,
      contentType: "application/octet-stream",
      body: bytes,
    })),
  ]);
}

/** A program whose one result, `t`, is a `bytes` value (the fake servers answer for it). */
function _returnsBytes(): Program {
  const program = new Program();
  program.return_({ key: "t", value: program.upload({ kind: "bytes", value: new Uint8Array(1) }) });
  return program;
}

/** Every position of LF--boundary, the slow way. */
function allMarks(body: Uint8Array, boundary: string): number[] {
  const needle = new TextEncoder().encode("\n--" + boundary);
  const out: number[] = [];
  outer: for (let i = 0; i + needle.length <= body.length; i++) {
    for (let k = 0; k < needle.length; k++) if (body[i + k] !== needle[k]) continue outer;
    out.push(i);
  }
  return out;
}

Deno.test("part digests: every payload hashed in arbitrary arrival steps; first one aligned", async () => {
  const payloads = [randomBytes(9_000_001), new Uint8Array(0), randomBytes(70)];
  const thread = new HashThread();
  for (
    const [json, threaded] of [
      ["{}", false],
      [`{"k":"${"x".repeat(5)}"}`, true],
      [`{"k":"${"y".repeat(6)}"}`, false],
      [`{"k":"${"z".repeat(7)}"}`, true],
    ] as const
  ) {
    const encoded = body(payloads, json);
    const digests = PartDigests.forMultipart(
      new Headers({ "content-type": encoded.contentType }),
      threaded ? thread : undefined,
    )!;
    const pad = digests.pad(encoded.body.subarray(0, 16384));
    const buffer = new Uint8Array(pad + encoded.body.length).subarray(pad);
    let received = 0;
    // Byte by byte through the first headers, then ever larger steps.
    for (const [step, until] of [[1, 300], [5, 2000], [4096, 3 << 20], [77_777, 6 << 20]]) {
      while (received < Math.min(until, buffer.length)) {
        const next = Math.min(buffer.length, received + step);
        buffer.set(encoded.body.subarray(received, next), received);
        received = next;
        await digests.update(buffer, received);
      }
    }
    while (received < buffer.length) {
      const next = Math.min(buffer.length, received + (1 << 20));
      buffer.set(encoded.body.subarray(received, next), received);
      received = next;
      await digests.update(buffer, received);
    }
    await digests.settle();
    const boundary = encoded.contentType.split("boundary=")[1];
    const parts = parseMultipart(buffer, boundary);
    // The marks found on the way are exactly every LF--boundary, and parsing with them agrees.
    const marks = digests.marksFor(buffer)!;
    assert.deepEqual(marks, allMarks(buffer, boundary));
    const reparsed = parseMultipart(buffer, boundary, { marks });
    assert.deepEqual(
      reparsed.map((p) => [p.name, p.body.byteOffset, p.body.length]),
      parts.map((p) => [p.name, p.body.byteOffset, p.body.length]),
    );
    assert.equal(digests.marksFor(buffer.subarray(1)), undefined);
    assert.equal(parts.length, 4);
    for (const part of parts) assert.equal(digests.lookup(part.body), sha256Hex(part.body));
    assert.equal(parts[1].body.byteOffset % 8, 0, `pad ${pad}`);
    // Bytes that are not exactly a payload seen are unknown, not guessed.
    assert.equal(digests.lookup(parts[1].body.subarray(1)), undefined);
    assert.equal(digests.lookup(parts[1].body.slice()), undefined);
  }
  assert.equal(
    PartDigests.forMultipart(new Headers({ "content-type": "application/json" })),
    undefined,
  );
});

Deno.test("part digests: a corrupted payload still fails the hash check", async () => {
  const data = randomBytes(9 << 20); // large enough to be hashed on the client's thread
  const declared = sha256Hex(data);
  data[12345] ^= 1; // the bytes sent no longer match the digest the result declares
  const results = `{"t":{"type":"bytes","part":"return:0","sha256":"${declared}"}}`;
  const encoded = body([data], completed("r1", results));
  const server = fakeServer(() =>
    new Response(encoded.body, { headers: { "content-type": encoded.contentType } })
  );
  try {
    await using client = new Client(server.url);
    const program = _returnsBytes();
    await assert.rejects(
      client.execute(program),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message.includes(
          `blob hash mismatch: declared ${declared}, computed ${sha256Hex(data)}`,
        ),
    );
  } finally {
    await server.close();
  }
});

Deno.test("part digests: a chunked answer (as a Router sends) is hashed as it comes: intact decodes, corrupted fails", async () => {
  const data = randomBytes(3 << 20);
  const declared = sha256Hex(data);
  const results = `{"t":{"type":"bytes","part":"return:0","sha256":"${declared}"}}`;
  let corrupt = false;
  const server = fakeServer(() => {
    const sent = data.slice();
    if (corrupt) sent[2_000_000] ^= 1;
    const encoded = body([sent], completed("r1", results));
    // A stream answers chunked: 1000 bytes, then 64 KiB pieces.
    const pieces = [encoded.body.subarray(0, 1000)];
    for (let at = 1000; at < encoded.body.length; at += 65536) {
      pieces.push(encoded.body.subarray(at, Math.min(encoded.body.length, at + 65536)));
    }
    return new Response(ReadableStream.from(pieces), {
      headers: { "content-type": encoded.contentType },
    });
  });
  try {
    await using client = new Client(server.url);
    const program = _returnsBytes();
    const result = await client.execute(program);
    const bytes = result.get("t") as Uint8Array;
    assert.equal(sha256Hex(bytes), declared);
    assert.equal(bytes.byteOffset % 8, 0, "the first binary payload is aligned");
    corrupt = true;
    await assert.rejects(
      client.execute(program),
      (error: unknown) =>
        error instanceof ProtocolError && error.message.includes("blob hash mismatch"),
    );
  } finally {
    await server.close();
  }
});

Deno.test("part digests: a payload holding boundary look-alikes keeps marks and digests exact", async () => {
  const boundary = "kcoral-0123456789abcdef0123456789abcdef";
  const tricky = new TextEncoder().encode(
    `x\n--${boundary}X no delimiter (bad tail)\r\n--${
      boundary.slice(0, 20)
    } partial\n--${boundary}`,
  );
  const payload = new Uint8Array(tricky.length + 100);
  payload.set(tricky);
  const head = (name: string) =>
    `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n` +
    `Content-Type: application/octet-stream\r\n\r\n`;
  const text = new TextEncoder();
  const bytes = new Uint8Array([
    ...text.encode(head("result").replace("octet-stream", "json") + "{}\r\n"),
    ...text.encode(head("return:0")),
    ...payload,
    ...text.encode(`\r\n--${boundary}--\r\n`),
  ]);
  const digests = PartDigests.forMultipart(
    new Headers({ "content-type": `multipart/form-data; boundary=${boundary}` }),
  )!;
  const buffer = new Uint8Array(bytes.length);
  for (let received = 0; received < bytes.length;) {
    const next = Math.min(bytes.length, received + 13);
    buffer.set(bytes.subarray(received, next), received);
    received = next;
    await digests.update(buffer, received);
  }
  await digests.settle();
  const marks = digests.marksFor(buffer)!;
  assert.deepEqual(marks, allMarks(buffer, boundary));
  // The strict parser rejects the LF--boundary inside the payload (followed by "X"), and the
  // one at its very end is a delimiter for it: with or without marks, the same outcome.
  const plain = (() => {
    try {
      return parseMultipart(buffer, boundary).map((p) => [p.name, p.body.length]);
    } catch (error) {
      return String(error);
    }
  })();
  const marked = (() => {
    try {
      return parseMultipart(buffer, boundary, { marks }).map((p) => [p.name, p.body.length]);
    } catch (error) {
      return String(error);
    }
  })();
  assert.deepEqual(marked, plain);
  for (const part of Array.isArray(plain) ? parseMultipart(buffer, boundary) : []) {
    const known = digests.lookup(part.body);
    if (known !== undefined) assert.equal(known, sha256Hex(part.body));
  }
});

Deno.test("part digests: a failed hashing thread loses only the shortcut, never the response", async () => {
  const payloads = [randomBytes(9 << 20), randomBytes(100)];
  const encoded = body(payloads);
  const thread = new HashThread();
  thread.close(); // as after a worker failure (e.g. no read permission for its module)
  const digests = PartDigests.forMultipart(
    new Headers({ "content-type": encoded.contentType }),
    thread,
  )!;
  const buffer = new Uint8Array(encoded.body.length);
  for (let received = 0; received < buffer.length;) {
    const next = Math.min(buffer.length, received + (1 << 20));
    buffer.set(encoded.body.subarray(received, next), received);
    received = next;
    await digests.update(buffer, received); // must not throw: the body is fine
  }
  await digests.settle();
  const parts = parseMultipart(buffer, encoded.contentType.split("boundary=")[1]);
  for (const part of parts) {
    const known = digests.lookup(part.body);
    assert.ok(known === undefined || known === sha256Hex(part.body));
  }
  // Parts after the failure are hashed inline.
  assert.equal(digests.lookup(parts[2].body), sha256Hex(payloads[1]));
});

/** Runs `source` in a fresh Deno with only network access; returns its exit and output. */
async function runScript(source: string, permissions: string[]) {
  const file = await Deno.makeTempFile({ suffix: ".ts" });
  await Deno.writeTextFile(file, source);
  try {
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        ...permissions,
        file,
      ],
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    const output = await child.output();
    clearTimeout(timer);
    const decoder = new TextDecoder();
    return {
      code: output.code,
      signal: output.signal,
      stdout: decoder.decode(output.stdout),
      stderr: decoder.decode(output.stderr),
    };
  } finally {
    await Deno.remove(file);
  }
}

function largeResultServer() {
  const data = randomBytes(9 << 20); // hashed on the client's thread
  const results = `{"t":{"type":"bytes","part":"return:0","sha256":"${sha256Hex(data)}"}}`;
  const encoded = body([data], completed("r1", results));
  return fakeServer(() =>
    new Response(encoded.body, { headers: { "content-type": encoded.contentType } })
  );
}

const _script = (url: string, close: boolean) => `
import { Client, Program } from ${JSON.stringify(new URL("../mod.ts", import.meta.url).href)};
const client = new Client(${JSON.stringify(url)});
const program = new Program();
program.return_({ key: "t", value: program.upload({ kind: "bytes", value: new Uint8Array(1) }) });
${
  close
    ? `const pending = client.execute(program);
client.close(); // closed while the request is in flight
const result = await pending;`
    : `const result = await client.execute(program); // the client is never closed`
}
console.log("bytes", (result.get("t") as Uint8Array).length);
`;

for (
  const [name, close, permissions] of [
    ["an unclosed client's hashing thread does not keep the process alive", false, [
      "--allow-net",
      "--allow-read",
    ]],
    ["closing during a large response starts no thread that outlives it", true, [
      "--allow-net",
      "--allow-read",
    ]],
    ["a large response is read without --allow-read (the thread cannot start)", false, [
      "--allow-net",
    ]],
  ] as const
) {
  Deno.test(`client: ${name}`, async () => {
    const server = largeResultServer();
    try {
      const run = await runScript(_script(server.url, close), [...permissions]);
      assert.equal(run.signal, null, `the script never exited: ${run.stdout}${run.stderr}`);
      assert.equal(run.code, 0, run.stderr);
      assert.equal(run.stdout.trim(), `bytes ${9 << 20}`);
    } finally {
      await server.close();
    }
  });
}

Deno.test("part digests: with a shared mirror the thread hashes there and spools payloads", async () => {
  const payloads = [randomBytes(9_000_001), randomBytes(5 << 20), new Uint8Array(0)];
  const encoded = body(payloads);
  const boundary = encoded.contentType.split("boundary=")[1];
  const thread = new HashThread();
  const dir = await Deno.makeTempDir();
  const seen: boolean[] = [];
  const recording = {
    open: () => thread.open(),
    spool: (path: string) => thread.spool(path),
    update: (id: number, bytes: Uint8Array) => {
      seen.push(bytes.buffer instanceof SharedArrayBuffer);
      return thread.update(id, bytes);
    },
    digest: (id: number) => thread.digest(id),
    written: (id: number) => thread.written(id),
    drop: (id: number) => thread.drop(id),
  };
  let files = 0;
  const observe = (mirror?: (m: SharedArrayBuffer) => void) =>
    PartDigests.forMultipart(new Headers({ "content-type": encoded.contentType }), recording, {
      mirror: () => {
        const buffer = new SharedArrayBuffer(encoded.body.length + 100);
        mirror?.(buffer);
        return buffer;
      },
      spool: (header) => header.includes('name="return:') ? `${dir}/spool-${files++}` : undefined,
    })!;
  const feed = async (digests: PartDigests, buffer: Uint8Array, until: number) => {
    for (let received = 0; received < until;) {
      const next = Math.min(until, received + 3_000_017);
      buffer.set(encoded.body.subarray(received, next), received);
      received = next;
      await digests.update(buffer, received);
    }
  };
  try {
    let mirror: SharedArrayBuffer | undefined;
    const digests = observe((m) => mirror = m);
    const buffer = new Uint8Array(encoded.body.length);
    await feed(digests, buffer, buffer.length);
    await digests.settle();
    assert.ok(seen.length > 2 && seen.every(Boolean)); // never from copies
    assert.deepEqual(new Uint8Array(mirror!, 0, buffer.length), buffer);
    const parts = parseMultipart(buffer, boundary).slice(1);
    assert.deepEqual(parts.map((p) => digests.lookup(p.body)), payloads.map(sha256Hex));
    // Each payload's file holds exactly its bytes; one taken stays, the others are deleted.
    const taken = digests.spooled(parts[0].body)!;
    assert.deepEqual(await Deno.readFile(taken), payloads[0]);
    assert.equal(digests.spooled(parts[0].body), undefined); // taken once
    assert.deepEqual(await Deno.readFile(digests.spooled(parts[1].body)!), payloads[1]);
    await digests.discardSpooled();
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), ["spool-0", "spool-1"]);
    await Deno.remove(taken);
    // A body given up half-way leaves no file behind: the payload being hashed is dropped.
    for (const entry of Deno.readDirSync(dir)) Deno.removeSync(`${dir}/${entry.name}`);
    const given = observe();
    await feed(given, new Uint8Array(encoded.body.length), 7_000_000);
    // Its thread may still read the mirror: not to be reused.
    assert.equal(await given.discardSpooled(), false);
    await thread.digest(thread.open()); // the thread has taken the drop (its file was created)
    for (let i = 0; i < 200 && [...Deno.readDirSync(dir)].length > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.deepEqual([...Deno.readDirSync(dir)], []);
    // The thread dies half-way: the server side deletes the file the thread can no longer drop.
    const orphaned = observe();
    await feed(orphaned, new Uint8Array(encoded.body.length), 7_000_000);
    await thread.digest(thread.open()); // the spool file exists by now
    assert.equal([...Deno.readDirSync(dir)].length, 1);
    thread.close();
    assert.equal(await orphaned.discardSpooled(), true); // a dead thread reads nothing more
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  } finally {
    thread.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("part digests: a spool file short of its payload is never handed out", async () => {
  const payload = randomBytes(3 << 20);
  const encoded = body([payload]);
  const thread = new HashThread();
  const dir = await Deno.makeTempDir();
  try {
    // A sink whose spools report one byte fewer than they were given (a short write).
    const short = {
      open: () => thread.open(),
      spool: (path: string) => thread.spool(path),
      update: (id: number, bytes: Uint8Array) => thread.update(id, bytes),
      digest: (id: number) => thread.digest(id),
      written: async (id: number) => ((await thread.written(id)) ?? 1) - 1,
      drop: (id: number) => thread.drop(id),
    };
    const digests = PartDigests.forMultipart(
      new Headers({ "content-type": encoded.contentType }),
      short,
      {
        mirror: () => new SharedArrayBuffer(encoded.body.length),
        spool: (header) => header.includes("return:0") ? `${dir}/spool` : undefined,
      },
    )!;
    const buffer = encoded.body.slice();
    await digests.update(buffer, buffer.length);
    await digests.settle();
    const boundary = encoded.contentType.split("boundary=")[1];
    const part = parseMultipart(buffer, boundary)[1];
    assert.equal(digests.lookup(part.body), sha256Hex(payload));
    assert.equal(digests.spooled(part.body), undefined);
    assert.equal(await digests.discardSpooled(), true); // nothing dropped: the mirror may go back
    assert.deepEqual([...Deno.readDirSync(dir)], []); // the unclaimed file is deleted
  } finally {
    thread.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("hash threads: digests, in-place hashing of shared bytes, spool files, drop", async () => {
  const { HashThreads } = await import("../protocol/hash_threads.ts");
  const threads = new HashThreads(2);
  const dir = await Deno.makeTempDir();
  try {
    const data = [randomBytes(9 << 20), randomBytes(1000)];
    const ids = data.map(() => threads.open());
    await Promise.all(ids.map((id, i) => threads.update(id, data[i])));
    assert.deepEqual(await Promise.all(ids.map((id) => threads.digest(id))), data.map(sha256Hex));
    // Shared bytes are hashed in place, in any number of ranges, and spooled by another thread;
    // copied bytes are not spooled; a file that cannot be created only loses the spool.
    const shared = new Uint8Array(new SharedArrayBuffer(data[0].length + 8), 8);
    shared.set(data[0]);
    const hash = threads.open();
    const spools = [`${dir}/spool-0`, `${dir}/spool-1`, `${dir}/missing/spool-2`].map((path) =>
      threads.spool(path)
    );
    for (let at = 0; at < shared.length; at += 3 << 20) {
      const range = shared.subarray(at, Math.min(shared.length, at + (3 << 20)));
      await threads.update(hash, range);
      await threads.update(spools[0], range);
    }
    await threads.update(spools[1], data[1]);
    await threads.update(spools[2], shared);
    assert.equal(await threads.digest(hash), sha256Hex(data[0]));
    assert.deepEqual(await Promise.all(spools.map((id) => threads.written(id))), [
      data[0].length,
      null,
      null,
    ]);
    assert.deepEqual(await Deno.readFile(`${dir}/spool-0`), data[0]);
    threads.close(); // every thread now counts as failed
    const again = threads.open(); // ...and is replaced when the next hash opens
    await threads.update(again, data[1]);
    assert.equal(await threads.digest(again), sha256Hex(data[1]));
    // A dropped spool's file is deleted (after the writes it had).
    const one = new HashThread();
    try {
      const dropped = one.spool(`${dir}/spool-3`);
      await one.update(dropped, shared.subarray(0, 1 << 20));
      one.drop(dropped);
      // Answered after the thread took the drop (so the file was created by then).
      assert.equal(await one.digest(one.open()), sha256Hex(new Uint8Array(0)));
      for (let i = 0; i < 200 && (await _exists(`${dir}/spool-3`)); i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.equal(await _exists(`${dir}/spool-3`), false);
    } finally {
      one.close();
    }
  } finally {
    threads.close();
    await Deno.remove(dir, { recursive: true });
  }
});

function _exists(path: string): Promise<boolean> {
  return Deno.lstat(path).then(() => true, () => false);
}

Deno.test("hash threads: rest stops the threads with nothing open; they start again on use", async () => {
  const { HashThreads } = await import("../protocol/hash_threads.ts");
  const threads = new HashThreads(2);
  try {
    const data = randomBytes(1 << 20);
    const busy = threads.open(); // on one thread, left open across the rest
    await threads.update(busy, data.subarray(0, 1000));
    const done = threads.open(); // on the other
    await threads.update(done, data);
    assert.equal(await threads.digest(done), sha256Hex(data));
    threads.rest();
    // The open hash's thread kept running: its hash goes on where it was.
    await threads.update(busy, data.subarray(1000));
    assert.equal(await threads.digest(busy), sha256Hex(data));
    // The stopped one was replaced by a fresh thread: hashes open and finish as before.
    const ids = [threads.open(), threads.open()];
    await Promise.all(ids.map((id) => threads.update(id, data)));
    assert.deepEqual(await Promise.all(ids.map((id) => threads.digest(id))), [
      sha256Hex(data),
      sha256Hex(data),
    ]);
  } finally {
    threads.close();
  }
});

Deno.test("client: an answer without a length (a Router's, chunked) is hashed on the thread, as a large one", () => {
  const length = (bytes: number) => new Headers({ "content-length": String(bytes) });
  assert.equal(hashesOnThread(new Headers({ "transfer-encoding": "chunked" })), true);
  assert.equal(hashesOnThread(length(8 * 1024 * 1024)), true);
  assert.equal(hashesOnThread(length(8 * 1024 * 1024 - 1)), false);
  assert.equal(hashesOnThread(length(300 * 1024)), false);
});
