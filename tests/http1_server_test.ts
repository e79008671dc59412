/**
 * http/http1_head.ts and http/http1_server.ts in one process: strict heads, bodies framed by
 * Content-Length and chunked (also arriving in pieces, read by a default reader from 1 byte to
 * 70 KB at a time), a body cut only after the body timeout without a byte, keep-alive and
 * pipelined requests, `Expect: 100-continue` answered only when the body is read, answers with and without a
 * length (a stream goes chunked; one that says so chunk by chunk, its field lines as given),
 * HEAD, the client's end aborting `request.signal` and cancelling an answer's stream, and a
 * protocol switch (`switchProtocols`) handing the connection over.
 */
import assert from "node:assert/strict";
import { HeadError, parseRequestHead } from "../http/http1_head.ts";
import { serveHttp1, switchProtocols } from "../http/http1_server.ts";
import { withFieldLines } from "../http/http1_response.ts";
import { wholeBody, withWholeBody } from "../http/whole_body.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { BodyTimeoutError } from "../http/request_body.ts";

const _encoder = new TextEncoder();
const _decoder = new TextDecoder("latin1");

Deno.test("http1 head: a valid head, its framing and connection options", () => {
  const head = parseRequestHead(_encoder.encode(
    "POST /execute?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\nConnection: close\r\n" +
      "Expect: 100-continue\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
  ));
  assert.equal(head.method, "POST");
  assert.equal(head.target, "/execute?x=1");
  assert.deepEqual(head.framing, { kind: "length", length: 5 });
  assert.equal(head.keepAlive, false);
  assert.equal(head.expectContinue, true);
  assert.deepEqual(head.fields.filter(([name]) => name === "x-a"), [["x-a", "1"], ["x-a", "2"]]);
  const chunked = parseRequestHead(
    _encoder.encode("POST / HTTP/1.1\nhost: h\ntransfer-encoding: Chunked\n\n"),
  );
  assert.deepEqual(chunked.framing, { kind: "chunked" });
  const old = parseRequestHead(_encoder.encode("GET / HTTP/1.0\r\n\r\n"));
  assert.equal(old.keepAlive, false);
});

Deno.test("http1 head: what two readers could disagree on is refused, naming it", () => {
  const cases: [string, RegExp, number?][] = [
    ["POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n", /conflicting/],
    ["POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1x\r\n\r\n", /invalid Content-Length/],
    [
      "POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
      /both/,
    ],
    ["POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: gzip, chunked\r\n\r\n", /unsupported/],
    ["POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", /HTTP\/1\.0/],
    ["GET / HTTP/1.1\r\nhost: h\r\nbad name: x\r\n\r\n", /invalid header field name/],
    ["GET / HTTP/1.1\r\nhost: h\r\nx: a\x01b\r\n\r\n", /invalid characters/],
    ["GET / HTTP/1.1\r\nhost: h\r\nx: a\r\n b\r\n\r\n", /folding/],
    ["GET / HTTP/1.1\r\nhost: h\r\nhost: i\r\n\r\n", /more than one Host/],
    ["GET / HTTP/1.1\r\n\r\n", /missing Host/],
    ["GET  / HTTP/1.1\r\nhost: h\r\n\r\n", /request line/],
    ["GET nothere HTTP/1.1\r\nhost: h\r\n\r\n", /request target/],
    ["GET / HTTP/2.0\r\nhost: h\r\n\r\n", /not supported/, 505],
    ["GET / HTTP/1.1\rx\r\nhost: h\r\n\r\n", /bare CR/],
  ];
  for (const [text, message, status] of cases) {
    assert.throws(() => parseRequestHead(_encoder.encode(text)), (error: unknown) => {
      assert.ok(error instanceof HeadError, text);
      assert.match(error.message, message, text);
      assert.equal(error.status, status ?? 400, text);
      return true;
    });
  }
});

/** Raw requests on one connection; resolves with everything received until the server closed. */
async function exchange(port: number, pieces: (string | Uint8Array)[], pauseMs = 0) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  for (const piece of pieces) {
    await conn.write(typeof piece === "string" ? _encoder.encode(piece) : piece);
    if (pauseMs) await new Promise((resolve) => setTimeout(resolve, pauseMs));
  }
  let text = "";
  const buffer = new Uint8Array(65536);
  for (;;) {
    const n = await conn.read(buffer).catch(() => null);
    if (n === null) break;
    text += _decoder.decode(buffer.subarray(0, n));
  }
  conn.close();
  return text;
}

Deno.test("http1 server: bodies by length and chunked, pipelined on one connection, then close", async () => {
  const seen: string[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      const body = request.body ? await request.text() : "";
      seen.push(`${request.method} ${new URL(request.url).pathname} ${body}`);
      return new Response(`got ${body.length}`, {
        headers: { "content-length": String(`got ${body.length}`.length) },
      });
    },
  });
  try {
    const text = await exchange(server.addr.port, [
      "POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\n\r\nhello" +
      "POST /b HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n",
      "2\r\nde\r\n0\r\ntrailer: x\r\n\r\n",
      "GET /c HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
    ], 20);
    assert.deepEqual(seen, ["POST /a hello", "POST /b abcde", "GET /c "]);
    const answers = text.split("HTTP/1.1 200 OK").slice(1);
    assert.equal(answers.length, 3);
    assert.match(answers[2], /connection: close/);
    assert.match(answers[1], /got 5$/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a small body that came with its head is kept whole; an answer's bytes kept whole go with their length", async () => {
  const kept: (string | undefined)[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      const whole = wholeBody(request);
      kept.push(whole && _decoder.decode(whole));
      // The stream still gives the bytes; once it is used, none are kept.
      const text = await request.text();
      kept.push(wholeBody(request) && "still kept");
      const bytes = _encoder.encode(`got ${text}`);
      return withWholeBody(new Response(bytes), bytes);
    },
  });
  try {
    const text = await exchange(server.addr.port, [
      "POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\n\r\nhello",
      // A body that comes after its head is streamed: nothing kept.
      "POST /b HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\nconnection: close\r\n\r\n",
      "abc",
    ], 50);
    assert.deepEqual(kept, ["hello", undefined, undefined, undefined]);
    const answers = text.split("HTTP/1.1 200 OK").slice(1);
    assert.equal(answers.length, 2);
    assert.match(answers[0], /content-length: 9\r\n/);
    assert.doesNotMatch(answers[0], /transfer-encoding/);
    assert.match(answers[0], /\r\n\r\ngot hello$/);
    assert.match(answers[1], /\r\n\r\ngot abc$/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a body read by a default reader in pieces of 1 byte to 70 KB arrives whole, each chunk given out intact", async () => {
  const bytes = new Uint8Array(200_000).map((_, i) => (i * 7 + (i >> 11)) & 255);
  const cuts = [1, 3, 8, 4096, 4100, 70_000, 70_010, 140_000, 200_000];
  const pieces = cuts.map((end, i) => bytes.subarray(cuts[i - 1] ?? 0, end));
  const received: { length: Uint8Array; chunked: Uint8Array }[] = [];
  const bodies: Uint8Array[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      // Every chunk kept as given until the end: a buffer reused under one would show.
      const chunks: Uint8Array[] = [];
      for await (const chunk of request.body!) chunks.push(chunk);
      const whole = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
      let at = 0;
      for (const chunk of chunks) whole.set(chunk, (at += chunk.length) - chunk.length);
      bodies.push(whole);
      return new Response("ok", { headers: { "content-length": "2" } });
    },
  });
  try {
    await exchange(server.addr.port, [
      `POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: ${bytes.length}\r\nconnection: close\r\n\r\n`,
      ...pieces,
    ], 15);
    const chunked = pieces.flatMap((piece) => [
      `${piece.length.toString(16)}\r\n`,
      piece,
      "\r\n",
    ]);
    await exchange(server.addr.port, [
      "POST /b HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
      ...chunked,
      "0\r\n\r\n",
    ], 5);
    received.push({ length: bodies[0], chunked: bodies[1] });
    assert.deepEqual(received[0].length, bytes);
    assert.deepEqual(received[0].chunked, bytes);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a body is cut (408) after bodyTimeoutMs without a byte, not while bytes keep coming", async () => {
  const outcomes: string[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    limits: { bodyTimeoutMs: 2000 },
    handler: async (request) => {
      try {
        outcomes.push(`read ${(await request.text()).length}`);
      } catch (error) {
        outcomes.push(error instanceof BodyTimeoutError ? "timeout" : String(error));
      }
      return new Response("ok", { headers: { "content-length": "2" } });
    },
  });
  try {
    // 12 bytes, one every 200 ms: longer than the timeout in all, never that long without one.
    const kept = await exchange(server.addr.port, [
      "POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 12\r\nconnection: close\r\n\r\n",
      ..."abcdefghijkl",
    ], 200);
    assert.match(kept, /^HTTP\/1\.1 200 /);
    // 2 bytes of 8, then nothing: cut once the timeout passed without one.
    const cut = await exchange(server.addr.port, [
      "POST /b HTTP/1.1\r\nhost: h\r\ncontent-length: 8\r\n\r\n",
      "ab",
    ]);
    assert.match(cut, /^HTTP\/1\.1 408 /);
    assert.match(cut, /"kind":"timeout","message":"request body not received in time/);
    assert.deepEqual(outcomes, ["read 12", "timeout"]);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: Expect: 100-continue only once the body is read; a refusal gets none", async () => {
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      if (new URL(request.url).pathname === "/refuse") {
        return new Response("no", { status: 413, headers: { "content-length": "2" } });
      }
      return new Response(await request.text());
    },
  });
  try {
    const refused = await exchange(server.addr.port, [
      "POST /refuse HTTP/1.1\r\nhost: h\r\nexpect: 100-continue\r\ncontent-length: 900000\r\n\r\n",
    ]);
    assert.match(refused, /^HTTP\/1\.1 413 /);
    assert.doesNotMatch(refused, /100 Continue/);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    await conn.write(_encoder.encode(
      "POST /echo HTTP/1.1\r\nhost: h\r\nexpect: 100-continue\r\nconnection: close\r\n" +
        "content-length: 3\r\n\r\n",
    ));
    const buffer = new Uint8Array(4096);
    const n = await conn.read(buffer);
    assert.equal(_decoder.decode(buffer.subarray(0, n!)), "HTTP/1.1 100 Continue\r\n\r\n");
    await conn.write(_encoder.encode("abc"));
    let rest = "";
    for (let m; (m = await conn.read(buffer)) !== null;) {
      rest += _decoder.decode(buffer.subarray(0, m));
    }
    conn.close();
    assert.match(rest, /^HTTP\/1\.1 200 OK/);
    assert.match(rest, /content-length: 3\r\n/);
    assert.match(rest, /\r\n\r\nabc$/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a streamed answer goes chunked; HEAD gets no body; a handler's failure is a 500 ERROR body", async () => {
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) => {
      const path = new URL(request.url).pathname;
      if (path === "/fail") throw new Error("boom");
      if (path === "/stream") {
        let n = 0;
        const body = new ReadableStream<Uint8Array>({
          async pull(controller) {
            await new Promise((resolve) => setTimeout(resolve, 5));
            if (n++ === 3) controller.close();
            else controller.enqueue(_encoder.encode(`part${n};`));
          },
        });
        return Promise.resolve(new Response(body));
      }
      return Promise.resolve(new Response("body"));
    },
  });
  const quiet = console.error;
  console.error = () => {};
  try {
    const streamed = await exchange(server.addr.port, [
      "GET /stream HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
    ]);
    assert.match(streamed, /transfer-encoding: chunked/);
    assert.match(streamed, /\r\n\r\n6\r\npart1;\r\n6\r\npart2;\r\n6\r\npart3;\r\n0\r\n\r\n$/);
    const head = await exchange(server.addr.port, [
      "HEAD /x HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
    ]);
    assert.match(head, /^HTTP\/1\.1 200 OK/);
    assert.ok(head.endsWith("\r\n\r\n"));
    const failed = await exchange(server.addr.port, [
      "GET /fail HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
    ]);
    assert.match(failed, /^HTTP\/1\.1 500 /);
    assert.match(failed, /"status":"ERROR","request_id":"[0-9a-f-]{36}","error":\{"kind":"engine"/);
  } finally {
    console.error = quiet;
    await server.shutdown();
  }
});

Deno.test("http1 server: a request has its method, URL, fields and body as sent, and one signal", async () => {
  const seen: unknown[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      const signal = request.signal;
      seen.push({
        request: request instanceof Request,
        method: request.method,
        url: request.url,
        // As a Headers made from the same lines: names lower-cased, a repeated one joined.
        fields: [...request.headers],
        same: [...request.headers].join() === [...new Headers(parsedFields)].join(),
        signal: signal === request.signal && signal instanceof AbortSignal && !signal.aborted,
        // A copy can be made (its signal is its own).
        copy: request.clone().headers.get("x-a"),
        body: await request.text(),
      });
      return new Response("ok");
    },
  });
  const head = "POST /p?q=1 HTTP/1.1\r\nHost: h:8\r\nX-A: 1\r\nx-b:\t b \r\nx-a: 2\r\n" +
    "content-length: 3\r\nconnection: close\r\n\r\n";
  const parsedFields = parseRequestHead(_encoder.encode(head)).fields;
  try {
    const text = await exchange(server.addr.port, [head + "abc"]);
    assert.match(text, /^HTTP\/1\.1 200 OK/);
    assert.deepEqual(seen, [{
      request: true,
      method: "POST",
      url: "http://h:8/p?q=1",
      fields: [
        ["connection", "close"],
        ["content-length", "3"],
        ["host", "h:8"],
        ["x-a", "1, 2"],
        ["x-b", "b"],
      ],
      same: true,
      signal: true,
      copy: "1, 2",
      body: "abc",
    }]);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: the client's end aborts request.signal once the body has arrived", async () => {
  const aborted = Promise.withResolvers<string>();
  const arrived = Promise.withResolvers<void>();
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: async (request) => {
      await request.bytes();
      arrived.resolve();
      await new Promise<void>((resolve) =>
        request.signal.addEventListener("abort", () => resolve(), { once: true })
      );
      aborted.resolve((request.signal.reason as Error).name);
      return new Response("nobody reads this");
    },
  });
  try {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    const body = new Uint8Array(200_000); // past one read, and past Deno.serve's 512 bytes
    await conn.write(_encoder.encode(
      `POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: ${body.length}\r\n\r\n`,
    ));
    await conn.write(body);
    await arrived.promise;
    conn.close();
    assert.equal(await aborted.promise, "ClientGoneError");
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a switchProtocols answer writes 101 and hands the connection over with what followed the head", async () => {
  const taken: { buffered: string; conn: Deno.Conn }[] = [];
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) =>
      Promise.resolve(
        new URL(request.url).pathname === "/switch"
          ? switchProtocols(
            [["upgrade", "echo"], ["connection", "Upgrade"]],
            ({ conn, buffered }) => taken.push({ conn, buffered: _decoder.decode(buffered) }),
          )
          : new Response("plain"),
      ),
  });
  try {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    // The new protocol's first bytes in the same write as the head.
    await conn.write(_encoder.encode(
      "GET /switch HTTP/1.1\r\nhost: h\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\nfirst",
    ));
    const buffer = new Uint8Array(4096);
    let head = "";
    while (!head.includes("\r\n\r\n")) {
      head += _decoder.decode(buffer.subarray(0, (await conn.read(buffer))!));
    }
    assert.match(
      head,
      /^HTTP\/1\.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: Upgrade\r\n/,
    );
    assert.equal(taken.length, 1);
    assert.equal(taken[0].buffered, "first");
    // The connection is the taker's: the server neither reads nor closes it, even at its stop.
    assert.equal(server.connections, 0);
    await server.shutdown();
    await conn.write(_encoder.encode("second"));
    const n = await taken[0].conn.read(buffer);
    assert.equal(_decoder.decode(buffer.subarray(0, n!)), "second");
    await taken[0].conn.write(_encoder.encode("back"));
    assert.equal(_decoder.decode(buffer.subarray(0, (await conn.read(buffer))!)), "back");
    taken[0].conn.close();
    conn.close();
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a switchProtocols answer to a request that is no upgrade is a 500", async () => {
  let takes = 0;
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: () => Promise.resolve(switchProtocols([], () => takes++)),
  });
  try {
    const text = await exchange(server.addr.port, ["GET / HTTP/1.1\r\nhost: h\r\n\r\n"]);
    assert.match(text, /^HTTP\/1\.1 500 /);
    assert.match(text, /connection: close/);
    assert.equal(takes, 0);
  } finally {
    await server.shutdown();
  }
});

Deno.test("http1 server: a chunked answer goes chunk by chunk, each written before the next is read, its field lines as given", async () => {
  const small = _encoder.encode("first chunk");
  const large = new Uint8Array(100_000).fill(7);
  let cancelled: unknown = null;
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) => {
      const path = new URL(request.url).pathname;
      const chunks = path === "/stream" ? [small, large, small] : [small];
      let handed: Uint8Array | null = null;
      const stream = new ReadableStream<Uint8Array>({
        // The chunk given before is detached as the next is asked for (as the Router does).
        pull(controller) {
          if (handed) releaseBuffer(handed);
          const next = chunks.shift();
          if (next) controller.enqueue(handed = next.slice());
          else if (path === "/stream") controller.close();
          else return new Promise(() => {}); // never more: the client leaves
        },
        cancel(reason) {
          cancelled = reason ?? "cancelled";
        },
      }, { highWaterMark: 0 });
      const fields: [string, string][] = [
        ["x-a", "1"],
        ["x-a", "2"],
        ["transfer-encoding", "chunked"],
      ];
      return Promise.resolve(withFieldLines(new Response(stream, { headers: fields }), fields));
    },
  });
  try {
    const text = await exchange(server.addr.port, [
      "GET /stream HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
    ]);
    const [head, body] = [
      text.slice(0, text.indexOf("\r\n\r\n")),
      text.slice(text.indexOf("\r\n\r\n") + 4),
    ];
    assert.match(head, /\r\nx-a: 1\r\nx-a: 2\r\n/);
    assert.match(head, /\r\ntransfer-encoding: chunked/);
    let decoded = "";
    for (let rest = body;;) {
      const line = rest.indexOf("\r\n");
      const size = parseInt(rest.slice(0, line), 16);
      if (size === 0) break;
      decoded += rest.slice(line + 2, line + 2 + size);
      assert.equal(rest.slice(line + 2 + size, line + 4 + size), "\r\n");
      rest = rest.slice(line + 4 + size);
    }
    assert.equal(decoded, "first chunk" + "\x07".repeat(100_000) + "first chunk");
    // The client's end while the answer streams cancels its stream.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    await conn.write(_encoder.encode("GET /leave HTTP/1.1\r\nhost: h\r\n\r\n"));
    const buffer = new Uint8Array(4096);
    let seen = "";
    while (!seen.includes("first chunk")) {
      seen += _decoder.decode(buffer.subarray(0, (await conn.read(buffer))!));
    }
    conn.close();
    for (let i = 0; i < 200 && cancelled === null; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.ok(cancelled !== null, "the stream was not cancelled");
  } finally {
    await server.shutdown();
  }
});
