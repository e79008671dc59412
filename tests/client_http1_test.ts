// The plain-HTTP transport of the client (client/transport/http1_agent.ts): framing, keep-alive, retries on
// stale connections, early answers, errors. Scripted raw TCP servers give exact control.
import assert from "node:assert/strict";
import { Http1Agent } from "../client/transport/http1_agent.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { randomBytes } from "./_bytes.ts";
import { sha256Hex } from "../protocol/hash.ts";

const _enc = new TextEncoder();
const _dec = new TextDecoder();

/** An agent for a loopback server on `port`. */
function loopbackAgent(
  port: number,
  connectTimeoutMs: number | null = 2000,
  idleReuseMs?: number,
): Http1Agent {
  return new Http1Agent({
    hostname: "127.0.0.1",
    port,
    host: `127.0.0.1:${port}`,
    connectTimeoutMs,
    idleReuseMs,
  });
}

/** `METHOD /path` of a request read by {@linkcode readRequest} (`null`: none came). */
function _requestLine(request: { head: string } | null): string {
  return request ? request.head.split("\r\n")[0].replace(/ HTTP\/1\.1$/, "") : "(none)";
}

/** A TCP server that runs `script` for every accepted connection. */
function rawServer(script: (conn: Deno.TcpConn, index: number) => Promise<void>) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  let connections = 0;
  const running: Promise<void>[] = [];
  const accepting = (async () => {
    for await (const conn of listener) {
      const index = connections++;
      running.push(
        script(conn, index).catch(() => {}).finally(() => {
          try {
            conn.close();
          } catch { /* closed */ }
        }),
      );
    }
  })();
  return {
    port,
    get connections() {
      return connections;
    },
    agent: () => loopbackAgent(port),
    async close() {
      listener.close();
      await accepting.catch(() => {});
      await Promise.all(running);
    },
  };
}

/** Reads one request head (and its Content-Length body) from `conn`. */
async function readRequest(conn: Deno.TcpConn): Promise<{ head: string; body: Uint8Array } | null> {
  let data: Uint8Array = new Uint8Array(0);
  const buf = new Uint8Array(65536);
  for (;;) {
    const text = _dec.decode(data);
    const end = text.indexOf("\r\n\r\n");
    if (end >= 0) {
      const head = text.slice(0, end);
      const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      const headBytes = _enc.encode(head).length + 4;
      while (data.length < headBytes + length) {
        const n = await conn.read(buf);
        if (n === null) return null;
        data = concatBytes([data, buf.subarray(0, n)]);
      }
      return { head, body: data.slice(headBytes, headBytes + length) };
    }
    const n = await conn.read(buf);
    if (n === null) return null;
    data = concatBytes([data, buf.subarray(0, n)]);
  }
}

async function send(conn: Deno.TcpConn, text: string): Promise<void> {
  const bytes = _enc.encode(text);
  let view = bytes;
  while (view.length) view = view.subarray(await conn.write(view));
}

Deno.test("http1: content-length and chunked bodies, keep-alive reuse, request framing", async () => {
  const seen: string[] = [];
  const server = rawServer(async (conn) => {
    for (let i = 0;; i++) {
      const request = await readRequest(conn);
      if (!request) return;
      seen.push(`${request.head}\n${_dec.decode(request.body)}`);
      if (i % 2 === 0) {
        await send(conn, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello");
      } else {
        await send(
          conn,
          "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" +
            "3;ext=1\r\nabc\r\n0a\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
        );
      }
    }
  });
  const agent = server.agent();
  try {
    const first = await agent.request("POST", "/p/execute", new Headers({ "x-k": "v" }), [
      _enc.encode("ab"),
      _enc.encode("cd"),
    ]);
    assert.equal(first.status, 200);
    assert.equal(_dec.decode(first.body), "hello");
    assert.equal(first.headers.get("x-a"), "1, 2");
    const second = await agent.request("GET", "/health", new Headers());
    assert.equal(second.status, 201);
    assert.equal(_dec.decode(second.body), "abc0123456789");
    assert.equal(server.connections, 1); // the connection was kept alive
    assert.ok(seen[0].startsWith(`POST /p/execute HTTP/1.1\r\nhost: 127.0.0.1:${server.port}\r\n`));
    assert.ok(seen[0].includes("x-k: v\r\n") && seen[0].includes("content-length: 4"));
    assert.ok(seen[0].endsWith("\nabcd"));
    assert.ok(
      seen[1].startsWith("GET /health HTTP/1.1\r\n") && !seen[1].includes("content-length"),
    );
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: a pooled connection closed as a request goes out: GET is retried, a sent POST is not", async () => {
  // The race the idle read cannot catch: the server takes the next request on a kept
  // connection and closes it without an answer (as when its idle timeout fires just then, or
  // after running it). A GET goes again; a POST that was all sent may have run: an error.
  const seen: string[] = [];
  const server = rawServer(async (conn, index) => {
    seen.push(_requestLine(await readRequest(conn)));
    await send(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    if (index === 0 || index === 1) seen.push(_requestLine(await readRequest(conn))); // no answer
  });
  const agent = server.agent();
  try {
    await agent.request("GET", "/a", new Headers()); // connection 0, kept
    const again = await agent.request("GET", "/b", new Headers()); // dropped, then connection 1
    assert.equal(_dec.decode(again.body), "ok");
    await assert.rejects(
      agent.request("POST", "/c", new Headers(), [_enc.encode("1")]), // on connection 1: dropped
      (e: Error) => e.message.includes("the server closed the connection without answering"),
    );
    assert.deepEqual(seen, ["GET /a", "GET /b", "GET /b", "POST /c"]); // the POST went once
    assert.equal(server.connections, 2);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: a connection idle longer than idleReuseMs is closed, not reused", async () => {
  const server = rawServer(async (conn) => {
    for (;;) {
      if (!(await readRequest(conn))) return;
      await send(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
  });
  const agent = loopbackAgent(server.port, 2000, 100);
  try {
    await agent.request("GET", "/", new Headers());
    await agent.request("GET", "/", new Headers()); // reused at once
    assert.equal(server.connections, 1);
    await new Promise((resolve) => setTimeout(resolve, 200));
    await agent.request("GET", "/", new Headers()); // too old: a new connection
    assert.equal(server.connections, 2);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: no answer on a new connection is an error, not a retry", async () => {
  const server = rawServer(async (conn) => {
    await readRequest(conn); // then close without answering
  });
  const agent = server.agent();
  try {
    await assert.rejects(
      agent.request("POST", "/x", new Headers(), [_enc.encode("1")]),
      (e: Error) => e.message.includes("the server closed the connection without answering"),
    );
    assert.equal(server.connections, 1);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: an early answer to a large body is read (413) and the connection dropped", async () => {
  const server = rawServer(async (conn) => {
    const buf = new Uint8Array(1024);
    await conn.read(buf); // the head only; the 32 MiB body is never read
    await send(
      conn,
      "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
  });
  const agent = server.agent();
  try {
    const response = await agent.request("POST", "/x", new Headers(), [new Uint8Array(32 << 20)]);
    assert.equal(response.status, 413);
    assert.equal(_dec.decode(response.body), "{}");
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: interim 100 responses are skipped; read-to-close bodies work", async () => {
  const server = rawServer(async (conn) => {
    await readRequest(conn);
    await send(conn, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil close");
  });
  const agent = server.agent();
  try {
    const response = await agent.request("GET", "/", new Headers());
    assert.equal(response.status, 200);
    assert.equal(_dec.decode(response.body), "until close");
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: malformed responses are errors naming the problem", async () => {
  const answers = [
    ["SPDY/3 200 OK\r\n\r\n", "malformed HTTP status line"],
    ["HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello", "malformed content-length"],
    ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"],
    ["HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer-encoding"],
    [
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
      "unsupported transfer-encoding: gzip, chunked",
    ],
    ["HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "before the end of the response body"],
    ["HTTP/1.1 200 OK\r\n bad: folded\r\n\r\n", "malformed HTTP header line"],
  ];
  for (const [answer, message] of answers) {
    const server = rawServer(async (conn) => {
      await readRequest(conn);
      await send(conn, answer);
    });
    const agent = server.agent();
    try {
      await assert.rejects(
        agent.request("GET", "/", new Headers()),
        (e: Error) => e.message.includes(message),
      );
    } finally {
      agent.close();
      await server.close();
    }
  }
});

Deno.test("http1: header bytes go out as they came in (a value echoed from a response)", async () => {
  let sent: Uint8Array = new Uint8Array(0);
  const server = rawServer(async (conn) => {
    const buf = new Uint8Array(4096);
    const n = await conn.read(buf);
    sent = buf.slice(0, n ?? 0);
    // "café" in UTF-8 as a response header: read as the byte string "cafÃ©".
    const head = _enc.encode("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Node: caf\u00e9\r\n\r\n");
    await conn.write(head);
  });
  const agent = server.agent();
  try {
    const first = await agent.request("GET", "/", new Headers());
    const node = first.headers.get("x-node")!;
    assert.equal(node, "caf\u00c3\u00a9");
    await agent.request("GET", "/", new Headers({ "x-node": node }));
    const line = new TextDecoder("latin1").decode(sent).split("\r\n")
      .find((l) => l.startsWith("x-node"))!;
    // The same two bytes (C3 A9), not those bytes encoded once more as UTF-8.
    assert.deepEqual([...line.slice(-2)].map((c) => c.charCodeAt(0)), [0xc3, 0xa9]);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: 101 Switching Protocols is a final answer, not an interim one", async () => {
  const server = rawServer(async (conn) => {
    await readRequest(conn);
    await send(
      conn,
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
    );
    await new Promise((resolve) => setTimeout(resolve, 300)); // keeps the connection open a while
  });
  const agent = server.agent();
  try {
    const response = await agent.request("GET", "/", new Headers());
    assert.equal(response.status, 101);
    assert.equal(agent.idleConnections, 0); // it speaks another protocol now: never reused
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: 48 MiB up and down through Deno.serve, bytes intact", async () => {
  const payload = randomBytes(48 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const body = new Uint8Array(await request.arrayBuffer());
    const stream = new URL(request.url).searchParams.has("stream");
    const headers = { "x-sha": sha256Hex(body) };
    // A stream answers chunked; a buffer answers with a Content-Length.
    return new Response(
      stream ? ReadableStream.from([body.subarray(0, 7), body.subarray(7)]) : body,
      { headers },
    );
  });
  const { port } = server.addr as Deno.NetAddr;
  const agent = loopbackAgent(port, null);
  try {
    for (const query of ["", "?stream"]) {
      const response = await agent.request("POST", `/echo${query}`, new Headers(), [
        payload.subarray(0, 1000),
        payload.subarray(1000),
      ]);
      assert.equal(response.status, 200);
      assert.equal(response.headers.get("x-sha"), sha256Hex(payload));
      assert.equal(sha256Hex(response.body), sha256Hex(payload));
    }
  } finally {
    agent.close();
    await server.shutdown();
  }
});

Deno.test("client transport: auto uses the built-in HTTP/1.1 on plain http, fetch on request", async () => {
  const { Client, ValidationError } = await import("../mod.ts");
  const { fakeServer, json } = await import("./fixtures/protocol/fake_server.ts");
  const server = fakeServer(() => json('{"status":"ok"}'));
  try {
    await using auto = new Client(server.url);
    await using viaFetch = new Client(server.url, { transport: "fetch" });
    assert.equal((await auto.health()).status, "ok");
    assert.equal((await viaFetch.health()).status, "ok");
    // fetch announces itself; the built-in transport sends only what the protocol needs.
    assert.equal(server.received[0].headers.get("user-agent"), null);
    assert.match(server.received[1].headers.get("user-agent") ?? "", /Deno/);
    assert.throws(
      () => new Client(server.url, { transport: "curl" as "fetch" }),
      (error: unknown) =>
        error instanceof ValidationError && /transport must be/.test(error.message),
    );
  } finally {
    await server.close();
  }
});

Deno.test("http1: a refused connection is tried once more before it is an error", async () => {
  const original = Deno.connect;
  let attempts = 0;
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  Deno.connect = ((options: Deno.ConnectOptions) => {
    attempts++;
    return original(options);
  }) as typeof Deno.connect;
  const agent = loopbackAgent(port);
  try {
    await assert.rejects(
      agent.request("GET", "/", new Headers()),
      (error: Error) => error.message.startsWith(`cannot connect to 127.0.0.1:${port}: `),
    );
    assert.equal(attempts, 2);
  } finally {
    Deno.connect = original;
    agent.close();
  }
});

Deno.test("http1: the retry after a stale pooled connection uses a new one, not another pooled one", async () => {
  // Every connection answers once and is then closed by the server (a restart, an idle
  // timeout): after two concurrent requests the agent pools two dead connections.
  let arrived = 0;
  let bothArrived!: () => void;
  const both = new Promise<void>((resolve) => (bothArrived = resolve));
  const server = rawServer(async (conn, index) => {
    await readRequest(conn);
    if (index < 2 && ++arrived === 2) bothArrived();
    if (index < 2) await both; // keep both connections busy at once
    await send(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    await new Promise((resolve) => setTimeout(resolve, 20));
  });
  const agent = server.agent();
  try {
    await Promise.all([
      agent.request("GET", "/a", new Headers()),
      agent.request("GET", "/b", new Headers()),
    ]);
    await new Promise((resolve) => setTimeout(resolve, 100)); // both pooled ones are closed now
    const response = await agent.request("POST", "/c", new Headers(), [_enc.encode("1")]);
    assert.equal(_dec.decode(response.body), "ok");
    assert.equal(server.connections, 3);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: an idle connection the server closes leaves the pool at once", async () => {
  const server = rawServer(async (conn) => {
    await readRequest(conn);
    await send(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    await new Promise((resolve) => setTimeout(resolve, 50)); // then closes (an idle timeout)
  });
  const agent = server.agent();
  try {
    await agent.request("GET", "/", new Headers());
    assert.equal(agent.idleConnections, 1);
    for (let i = 0; i < 50 && agent.idleConnections > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(agent.idleConnections, 0);
    const again = await agent.request("GET", "/", new Headers()); // a new connection, no retry
    assert.equal(_dec.decode(again.body), "ok");
    assert.equal(server.connections, 2);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: a kept connection serves the next response through its idle read", async () => {
  const server = rawServer(async (conn) => {
    for (let i = 0; i < 3; i++) {
      if (!(await readRequest(conn))) return;
      await new Promise((resolve) => setTimeout(resolve, 30)); // the idle read waits for this
      await send(conn, `HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n${i}`);
    }
  });
  const agent = server.agent();
  try {
    const answers = [];
    for (let i = 0; i < 3; i++) {
      answers.push(_dec.decode((await agent.request("GET", "/", new Headers())).body));
    }
    assert.deepEqual(answers, ["0", "1", "2"]);
    assert.equal(server.connections, 1);
  } finally {
    agent.close();
    await server.close();
  }
});

Deno.test("http1: after a large response the next one is read into a buffer touched while waiting", async () => {
  const payload = randomBytes(12 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    const n = Number(new URL(request.url).searchParams.get("n"));
    return new Response(payload.subarray(0, n));
  });
  const { port } = server.addr as Deno.NetAddr;
  const agent = loopbackAgent(port, null);
  // An observer that pads the body by 3 bytes, as the client's part digests do for alignment.
  const padded = () => ({ pad: () => 3, update: () => {} });
  const get = async (n: number, pad = false) => {
    const response = await agent.request(
      "GET",
      `/?n=${n}`,
      new Headers(),
      [],
      pad ? padded : undefined,
    );
    assert.equal(response.body.length, n);
    assert.ok(response.body.every((byte, i) => byte === payload[i]) || n === 0);
    if (pad) assert.equal(response.body.byteOffset, 3);
    return agent.prefaultedResponses;
  };
  try {
    assert.equal(await get(12 << 20), 0); // nothing to go by yet
    assert.equal(await get(12 << 20), 1); // the same size again: prepared
    assert.equal(await get(9 << 20), 1); // much smaller: a fresh buffer instead of a wasteful one
    assert.equal(await get(9 << 20, true), 2); // padded bodies fit the prepared buffer too
    assert.equal(await get(9 << 20, true), 3);
    assert.equal(await get(100), 3); // one small answer (say, a CACHE_MISS) keeps the expectation
    assert.equal(await get(9 << 20), 4);
    assert.equal(await get(100), 4);
    assert.equal(await get(100), 4); // two end it
    assert.equal(await get(9 << 20), 4);
  } finally {
    agent.close();
    await server.shutdown();
  }
});

Deno.test("http1: a chunked answer (as a Router sends) is read into the prepared buffer too, and grows out of it", async () => {
  const payload = randomBytes(12 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    const n = Number(new URL(request.url).searchParams.get("n"));
    // A stream of 256 KiB pieces: chunked, no Content-Length.
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let at = 0; at < n; at += 256 << 10) {
          controller.enqueue(payload.slice(at, Math.min(n, at + (256 << 10))));
        }
        controller.close();
      },
    });
    return new Response(body);
  });
  const agent = loopbackAgent((server.addr as Deno.NetAddr).port, null);
  const padded = () => ({ pad: () => 5, update: () => {} });
  const get = async (n: number, pad = false) => {
    const response = await agent.request(
      "GET",
      `/?n=${n}`,
      new Headers(),
      [],
      pad ? padded : undefined,
    );
    assert.equal(response.headers.get("transfer-encoding"), "chunked");
    assert.equal(response.body.length, n);
    assert.ok(response.body.every((byte, i) => byte === payload[i]), `body of ${n} bytes intact`);
    if (pad) assert.equal(response.body.byteOffset, 5);
    return agent.prefaultedResponses;
  };
  try {
    assert.equal(await get(9 << 20), 0); // nothing to go by yet
    assert.equal(await get(9 << 20), 1); // the chunked answer's size was learnt: prepared
    assert.equal(await get(9 << 20, true), 2); // padded, within the slack
    assert.equal(await get(12 << 20), 2); // larger than prepared: grows out of it, intact
    assert.equal(await get(12 << 20), 3); // and the larger size is prepared next
    // Much smaller than prepared: a buffer of its own, not a view that holds the prepared one.
    const small = await agent.request("GET", `/?n=${1 << 20}`, new Headers());
    assert.ok(small.body.every((byte, i) => byte === payload[i]));
    assert.equal(small.body.buffer.byteLength, 1 << 20);
    assert.equal(agent.prefaultedResponses, 3);
  } finally {
    agent.close();
    await server.shutdown();
  }
});

Deno.test("http1: a large chunked answer with nothing prepared grows in place, intact", async () => {
  const payload = randomBytes(12 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => {
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        // Uneven pieces, so that growth steps fall inside chunks.
        for (let at = 0; at < payload.length; at += 300_001) {
          controller.enqueue(payload.slice(at, Math.min(payload.length, at + 300_001)));
        }
        controller.close();
      },
    });
    return new Response(body);
  });
  const agent = loopbackAgent((server.addr as Deno.NetAddr).port, null);
  try {
    const response = await agent.request("GET", "/", new Headers(), [], () => ({
      pad: () => 3,
      update: () => {},
    }));
    assert.equal(response.headers.get("transfer-encoding"), "chunked");
    assert.equal(agent.prefaultedResponses, 0);
    assert.equal(response.body.length, payload.length);
    assert.equal(response.body.byteOffset, 3);
    assert.ok(response.body.every((byte, i) => byte === payload[i]), "body intact");
    assert.ok((response.body.buffer as ArrayBuffer).resizable, "grown in place, not copied");
    // What the caller gets works with the platform's byte APIs.
    const digest = await crypto.subtle.digest("SHA-256", response.body as Uint8Array<ArrayBuffer>);
    assert.equal(digest.byteLength, 32);
  } finally {
    agent.close();
    await server.shutdown();
  }
});

Deno.test("http1: a body buffer grows in place within its reservation, and moves once past it", async () => {
  const { growBodyBuffer } = await import("../client/transport/http1_reader.ts");
  const small = new Uint8Array(1000).fill(7);
  const plain = growBodyBuffer(small, 1000, 5000);
  assert.equal((plain.buffer as ArrayBuffer).resizable, false); // small: a plain copy
  assert.deepEqual(plain.subarray(0, 1000), small);
  const first = growBodyBuffer(plain, 1000, 3 << 20);
  const backing = first.buffer as ArrayBuffer;
  assert.ok(backing.resizable && backing.maxByteLength >= 256 << 20);
  first[(3 << 20) - 1] = 9;
  const second = growBodyBuffer(first, 3 << 20, 10 << 20);
  assert.equal(second.buffer, backing, "grown in place");
  assert.equal(second[(3 << 20) - 1], 9);
  assert.deepEqual(second.subarray(0, 1000), small);
  // A reservation too small for what is needed: the bytes move into a larger one.
  const tight = new Uint8Array(new ArrayBuffer(2 << 20, { maxByteLength: 4 << 20 }));
  tight.set(small);
  const moved = growBodyBuffer(tight, 1000, 8 << 20);
  assert.notEqual(moved.buffer, tight.buffer);
  assert.ok(moved.length >= 8 << 20);
  assert.deepEqual(moved.subarray(0, 1000), small);
  // Fixed-length views: growing the buffer later does not change what a caller holds.
  for (const view of [first, moved]) {
    const length = view.length;
    const backing = view.buffer as ArrayBuffer;
    backing.resize(Math.min(backing.maxByteLength, backing.byteLength + 4096));
    assert.equal(view.length, length);
  }
});

Deno.test("http1: of concurrent requests after a large answer, one at a time prepares a buffer", async () => {
  const payload = randomBytes(12 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async () => {
    await new Promise((r) => setTimeout(r, 50)); // all three are waiting at once
    return new Response(payload);
  });
  const agent = loopbackAgent((server.addr as Deno.NetAddr).port, null);
  try {
    await agent.request("GET", "/", new Headers());
    // Each waiting request holding a buffer as large as the last answer would multiply memory
    // by the number of requests in flight (12 of them after a 128 MiB result: 1.4 GiB).
    await Promise.all([1, 2, 3].map(() => agent.request("GET", "/", new Headers())));
    assert.equal(agent.prefaultedResponses, 1);
  } finally {
    agent.close();
    await server.shutdown();
  }
});

Deno.test("http1: preparing a buffer for a large answer never holds a small answer back", async () => {
  const { Prefault } = await import("../client/transport/prefault.ts");
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const echo = (async () => {
    const conn = await listener.accept();
    const byte = new Uint8Array(1);
    while ((await conn.read(byte)) !== null) await conn.write(byte);
    conn.close();
  })();
  const conn = await Deno.connect({
    hostname: "127.0.0.1",
    port: (listener.addr as Deno.NetAddr).port,
  });
  const size = 512 << 20;
  try {
    const prefault = new Prefault(size);
    await conn.write(new Uint8Array([7]));
    assert.equal(await conn.read(new Uint8Array(1)), 1);
    const touched = prefault.touched;
    prefault.stop();
    // The answer comes while the buffer is being touched, usually within a few slices (a loop
    // of MessagePort yields touched all of it first). Only "before the end" is asserted: under
    // a loaded CI machine the few slices can be many.
    assert.ok(touched < size, `all ${touched} bytes were touched before the answer was read`);
  } finally {
    conn.close();
    await echo;
    listener.close();
  }
});

Deno.test("http1: a chunked body is watched as it arrives, padded as the observer asks", async () => {
  const payload = randomBytes(5 << 20);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => {
    // A stream answers chunked (as a Router does): pieces of 100 bytes, then 256 KiB each.
    const pieces = [payload.subarray(0, 100)];
    for (let at = 100; at < payload.length; at += 256 << 10) {
      pieces.push(payload.subarray(at, Math.min(payload.length, at + (256 << 10))));
    }
    return new Response(ReadableStream.from(pieces));
  });
  const { port } = server.addr as Deno.NetAddr;
  const agent = loopbackAgent(port, null);
  const seen: number[] = [];
  let prefix = 0;
  let last: Uint8Array | null = null;
  const observer = () => ({
    pad: (first: Uint8Array) => (prefix = first.length, 5),
    update: (body: Uint8Array, received: number) => {
      assert.equal(body.length, received);
      assert.ok(body.every((byte, i) => byte === payload[i]), `the first ${received} bytes`);
      seen.push(received);
      last = body;
    },
  });
  try {
    const response = await agent.request("GET", "/", new Headers(), [], observer);
    assert.equal(response.headers.get("transfer-encoding"), "chunked");
    assert.equal(sha256Hex(response.body), sha256Hex(payload));
    assert.equal(prefix, 100, "the padding is asked for with the first chunk");
    assert.equal(response.body.byteOffset, 5);
    assert.equal(seen.at(-1), payload.length);
    assert.ok(seen.length >= 2, `updates as the body arrives: ${seen.join()}`);
    assert.ok(seen.every((n, i) => i === 0 || n > seen[i - 1]), "the body only grows");
    // Every 2 MiB as a Content-Length body's, not at each of its 21 chunks (each update hands the
    // new bytes to a hash thread in one message), and once at the end.
    assert.ok(
      seen.slice(0, -1).every((n, i) => n - (seen[i - 1] ?? 0) >= 2 << 20),
      `updates every 2 MiB: ${seen.join()}`,
    );
    assert.ok(seen.length <= 3, `${seen.length} updates: ${seen.join()}`);
    // The last update saw the very bytes the response carries (digests are found by position).
    const lastSeen = last as Uint8Array | null;
    assert.ok(lastSeen !== null && lastSeen.buffer === response.body.buffer);
    assert.equal(lastSeen.byteOffset, response.body.byteOffset);
  } finally {
    agent.close();
    await server.shutdown();
  }
});
