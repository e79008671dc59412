import assert from "node:assert/strict";
import { blobBoundary } from "../client/_blob_boundary.ts";
import { adoptBytes } from "../client/_known_digests.ts";
import {
  Client,
  KCoralError,
  Program,
  ProtocolError,
  Tensor,
  TransportError,
  ValidationError,
} from "../mod.ts";
import { encodeExecuteResponse, errorBody, sha256Hex } from "../protocol/mod.ts";
import { cacheMiss, completed, fakeServer, json } from "./fixtures/protocol/fake_server.ts";

const _HEALTH_PROBE = new URL("./fixtures/client/health_probe.ts", import.meta.url).pathname;

const SPEC_PROGRAM =
  '{"instructions":[{"op":"upload","kind":"module","source":"def add_one(x):\\n    return x + 1\\n","id":"upload_0"},{"op":"get_function","id":"get_function_1","module":{"$ref":"upload_0"},"name":"add_one"},{"op":"upload","kind":"tensor","blob":"ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1","dtype":"float32","shape":[4],"id":"upload_2"},{"op":"run","id":"run_3","fn":{"$ref":"get_function_1"},"args":[{"$ref":"upload_2"}]},{"op":"return","key":"y","value":{"$ref":"run_3"}}],"options":{"timeout_seconds":30}}';
const TENSOR_HASH = "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1";
const RESULT_HASH = "1180e36f58837887478f2d0dc12271b6ec4b103f20b533f8af7d44c313e27c18";

function specProgram(): Program {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "def add_one(x):\n    return x + 1\n" });
  const fn = p.getFunction({ module: mod, name: "add_one" });
  const x = p.upload({ kind: "tensor", value: new Float32Array([1, 2, 3, 4]), shape: [4] });
  const y = p.run({ fn, args: [x] });
  p.return_({ key: "y", value: y });
  return p;
}

function bytesProgram(...contents: string[]): Program {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "def f(*a):\n    return len(a)\n" });
  const fn = p.getFunction({ module: mod, name: "f" });
  const args = contents.map((text) =>
    p.upload({ kind: "bytes", value: new TextEncoder().encode(text) })
  );
  p.return_({ key: "n", value: p.run({ fn, args }) });
  return p;
}

function hashOf(text: string): string {
  return sha256Hex(new TextEncoder().encode(text));
}

Deno.test("client: the spec §10 exchange, byte for byte", async () => {
  const server = fakeServer((request, index) => {
    if (index === 0) return json(cacheMiss("0b6f4a52-1c3e-4d7a-9f10-2a8e5c7d9b31", [TENSOR_HASH]));
    const result = completed(
      "5e2d8c41-7a9b-4c0d-8e1f-3b6a2d9c4e75",
      `{"y":{"type":"tensor","part":"return:0","sha256":"${RESULT_HASH}","dtype":"float32","shape":[4]}}`,
    );
    const encoded = encodeExecuteResponse(result, [
      new Uint8Array(new Float32Array([2, 3, 4, 5]).buffer),
    ]);
    assert.ok(request.execute);
    return new Response(encoded.body, { headers: { "content-type": encoded.contentType } });
  });
  try {
    await using client = new Client(server.url);
    const result = await client.execute(specProgram(), { timeoutSeconds: 30 });
    assert.equal(result.status, "COMPLETED");
    assert.equal(result.requestId, "5e2d8c41-7a9b-4c0d-8e1f-3b6a2d9c4e75");
    const y = result.get<Tensor>("y");
    assert.ok(y instanceof Tensor);
    assert.equal(y.dtype, "float32");
    assert.deepEqual(y.shape, [4]);
    assert.deepEqual(y.data, new Float32Array([2, 3, 4, 5]));

    const [first, second] = server.received;
    assert.equal(server.received.length, 2);
    assert.equal(first.programText, SPEC_PROGRAM);
    assert.equal(second.programText, SPEC_PROGRAM);
    assert.equal(first.execute!.blobs.size, 0);
    assert.deepEqual([...second.execute!.blobs.keys()], [TENSOR_HASH]);
    // Program part: no filename, application/json; blob parts: octet-stream.
    const raw = new TextDecoder("latin1").decode(second.body);
    assert.ok(
      raw.includes(
        'Content-Disposition: form-data; name="program"\r\nContent-Type: application/json\r\n\r\n{',
      ),
    );
    assert.ok(
      raw.includes(
        `Content-Disposition: form-data; name="blob:${TENSOR_HASH}"\r\nContent-Type: application/octet-stream\r\n\r\n`,
      ),
    );
    assert.equal(first.headers.get("x-kcoral-node"), null);
  } finally {
    await server.close();
  }
});

Deno.test("client: CACHE_MISS twice, then attempt 3 sends every blob; X-KCoral-Node echoed", async () => {
  const [a, b, c] = ["alpha", "beta", "gamma"].map(hashOf);
  const server = fakeServer((_request, index) => {
    if (index === 0) return json(cacheMiss("r1", [b]), { headers: { "X-KCoral-Node": "node-1" } });
    if (index === 1) {
      return json(cacheMiss("r2", [c, a]), { headers: { "X-KCoral-Node": "node-2" } });
    }
    return json(completed("r3", '{"n":{"type":"integer","value":3}}'));
  });
  try {
    await using client = new Client(server.url);
    const program = bytesProgram("alpha", "beta", "gamma");
    const result = await client.execute(program);
    assert.equal(result.requestId, "r3");
    assert.equal(result.get("n"), 3);
    const blobs = server.received.map((r) => [...r.execute!.blobs.keys()]);
    assert.deepEqual(blobs, [[], [b], [a, b, c]]);
    assert.deepEqual(server.received.map((r) => r.headers.get("x-kcoral-node")), [
      null,
      "node-1",
      "node-2",
    ]);
    assert.ok(server.received.every((r) => r.programText === server.received[0].programText));
    // Every attempt uses the boundary checked against the blobs when they were added.
    assert.ok(
      server.received.every((r) =>
        r.headers.get("content-type") === `multipart/form-data; boundary=${blobBoundary(program)}`
      ),
    );
  } finally {
    await server.close();
  }
});

Deno.test("client: attempt 2 sends exactly the missing blobs, in program order", async () => {
  const [a, , c] = ["alpha", "beta", "gamma"].map(hashOf);
  const server = fakeServer((_request, index) =>
    index === 0
      ? json(cacheMiss("r1", [c, a]), { headers: { "X-KCoral-Node": "x".repeat(513) } })
      : json(completed("r2"))
  );
  try {
    await using client = new Client(server.url);
    await client.execute(bytesProgram("alpha", "beta", "gamma"));
    assert.deepEqual([...server.received[1].execute!.blobs.keys()], [a, c]);
    assert.equal(server.received[1].headers.get("x-kcoral-node"), null); // 513 chars: not echoed
  } finally {
    await server.close();
  }
});

Deno.test("client: an adopted blob that holds the program's boundary is sent under another", async () => {
  const program = bytesProgram("alpha");
  const boundary = blobBoundary(program)!;
  const adopted = new TextEncoder().encode(`x\r\n--${boundary}\r\n`);
  adoptBytes(adopted, sha256Hex(adopted));
  const mod = program.upload({ kind: "module", source: "def g(b):\n    return len(b)\n" });
  const fn = program.getFunction({ module: mod, name: "g" });
  const arg = program.upload({ kind: "bytes", value: adopted });
  program.return_({ key: "m", value: program.run({ fn, args: [arg] }) });
  assert.equal(blobBoundary(program), boundary); // not scanned when added
  const server = fakeServer((_request, index) =>
    index === 0 ? json(cacheMiss("r1", [sha256Hex(adopted)])) : json(completed("r2"))
  );
  try {
    await using client = new Client(server.url);
    await client.execute(program);
    const sent = server.received[1];
    assert.notEqual(sent.headers.get("content-type"), `multipart/form-data; boundary=${boundary}`);
    assert.deepEqual(sent.execute!.blobs.get(sha256Hex(adopted)), adopted);
  } finally {
    await server.close();
  }
});

Deno.test("client: a server that always misses gives ProtocolError after three attempts", async () => {
  const server = fakeServer(() => json(cacheMiss("r", [hashOf("alpha")])));
  try {
    await using client = new Client(server.url);
    await assert.rejects(
      client.execute(bytesProgram("alpha")),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message === "server still reports CACHE_MISS after a complete blob resend",
    );
    assert.equal(server.received.length, 3);
  } finally {
    await server.close();
  }
});

Deno.test("client: CACHE_MISS protocol violations are ProtocolErrors", async () => {
  const unknown = "c".repeat(64);
  const answers: [() => Response, string][] = [
    [
      () => {
        const encoded = encodeExecuteResponse(cacheMiss("r", [hashOf("alpha")]), [
          new Uint8Array(1),
        ]);
        return new Response(encoded.body, { headers: { "content-type": encoded.contentType } });
      },
      "CACHE_MISS response must not contain binary parts",
    ],
    [
      () => json(cacheMiss("r", [unknown])),
      `server misses blobs with no local bytes to send: ['${unknown}']`,
    ],
    [() => json(cacheMiss("r", [])), "CACHE_MISS response needs a non-empty 'missing_blobs' array"],
    [() => json(cacheMiss("r", ["zz"])), "CACHE_MISS response contains an invalid blob hash"],
  ];
  for (const [answer, message] of answers) {
    const server = fakeServer(answer);
    try {
      await using client = new Client(server.url);
      await assert.rejects(client.execute(bytesProgram("alpha")), (error: unknown) => {
        assert.ok(error instanceof ProtocolError);
        assert.equal(error.message, message);
        return true;
      });
      assert.equal(server.received.length, 1);
    } finally {
      await server.close();
    }
  }
});

Deno.test("client: a non-200 answer is a KCoralError at once, never retried", async () => {
  const server = fakeServer(() =>
    json(errorBody("req-1", "busy", "server saturated"), {
      status: 503,
      headers: { "Retry-After": "1" },
    })
  );
  try {
    await using client = new Client(server.url);
    await assert.rejects(client.execute(bytesProgram("alpha")), (error: unknown) => {
      assert.ok(error instanceof KCoralError);
      assert.equal(error.statusCode, 503);
      assert.equal(error.detail, "server saturated");
      assert.equal(error.message, "HTTP 503: server saturated");
      assert.equal(error.kind, "busy");
      assert.equal(error.requestId, "req-1");
      return true;
    });
    assert.equal(server.received.length, 1);
  } finally {
    await server.close();
  }
  // A non-200 on the second attempt stops there too; a redirect is not followed.
  const second = fakeServer((_request, index) =>
    index === 0
      ? json(cacheMiss("r", [hashOf("alpha")]))
      : new Response("moved", { status: 307, headers: { location: "/elsewhere" } })
  );
  try {
    await using client = new Client(second.url);
    await assert.rejects(
      client.execute(bytesProgram("alpha")),
      (error: unknown) =>
        error instanceof KCoralError && error.statusCode === 307 && error.detail === "HTTP 307",
    );
    assert.equal(second.received.length, 2);
  } finally {
    await second.close();
  }
});

Deno.test("client: connection refused and unreachable hosts are TransportErrors", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  await using client = new Client(`http://127.0.0.1:${port}`);
  await assert.rejects(client.execute(bytesProgram("alpha")), TransportError);
  await assert.rejects(client.health(), TransportError);
  // (A host that never answers is simulated below: sandboxes may answer any address.)
});

Deno.test("client: the connect timeout never limits how long a program runs", async () => {
  const server = fakeServer(async () => {
    await new Promise((resolve) => setTimeout(resolve, 800));
    return json(completed("slow"));
  });
  try {
    await using client = new Client(server.url, { connectTimeoutSeconds: 0.2 });
    const result = await client.execute(bytesProgram());
    assert.equal(result.requestId, "slow");
  } finally {
    await server.close();
  }
});

Deno.test("client: options, headers, URL prefix and argument checks", async () => {
  const server = fakeServer(() => json(completed("r")));
  try {
    await using client = new Client(server.url + "/prefix//", {
      headers: { Authorization: "Bearer t" },
    });
    assert.equal(client.baseUrl, server.url + "/prefix");
    await client.execute(bytesProgram(), { outputLimitBytes: 5, timeoutSeconds: 1.5, gpuCount: 2 });
    assert.equal(server.received[0].path, "/prefix/execute");
    assert.equal(server.received[0].headers.get("authorization"), "Bearer t");
    assert.ok(
      server.received[0].programText!.endsWith(
        '"options":{"gpu_count":2,"timeout_seconds":1.5,"output_limit_bytes":5}}',
      ),
    );
    await client.execute(bytesProgram());
    assert.ok(server.received[1].programText!.endsWith("]}"));
    assert.ok(!server.received[1].programText!.includes('"options"'));
    for (const gpuCount of [0, 9, 1.5, NaN]) {
      await assert.rejects(client.execute(bytesProgram(), { gpuCount }), ValidationError);
    }
    await assert.rejects(client.execute({} as Program), TypeError);
    assert.equal(server.received.length, 2);
  } finally {
    await server.close();
  }
  assert.throws(() => new Client("ftp://x"), ValidationError);
  assert.throws(() => new Client("http://x", { connectTimeoutSeconds: 0 }), ValidationError);
});

Deno.test("client: malformed 200 answers are ProtocolErrors", async () => {
  const server = fakeServer((_request, index) =>
    index === 0
      ? new Response("<html>", { headers: { "content-type": "text/html" } })
      : json('{"status":"COMPLETED"}')
  );
  try {
    await using client = new Client(server.url);
    await assert.rejects(
      client.execute(bytesProgram()),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message === "unsupported response content type: 'text/html'",
    );
    await assert.rejects(
      client.execute(bytesProgram()),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message === "malformed execution response: 'request_id'",
    );
  } finally {
    await server.close();
  }
});

Deno.test("client: health() and target()", async () => {
  const bodies = [
    '{"status":"ok","instance_id":"i","gpu_count":1,"load":{"request_capacity":8},"target":{"arch":"sm_90a"},"versions":{"torch":"2.9.0"}}',
    '{"status":"ok","target":{}}',
    '{"status":"unavailable"}',
    "[]",
  ];
  const server = fakeServer((request, index) => {
    assert.equal(request.method, "GET");
    return index === 4
      ? json(errorBody("", "engine", "boom"), { status: 500 })
      : json(bodies[index]);
  });
  try {
    await using client = new Client(server.url);
    const health = await client.health();
    assert.equal(health.status, "ok");
    assert.deepEqual(health.load, { request_capacity: 8 });
    assert.deepEqual(health.versions, { torch: "2.9.0" });
    await assert.rejects(
      client.target(),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message === "the server reported no compilation target",
    );
    await assert.rejects(
      client.health(),
      (error: unknown) =>
        error instanceof ProtocolError && error.message === "health status is not ok",
    );
    await assert.rejects(
      client.health(),
      (error: unknown) =>
        error instanceof ProtocolError && error.message === "JSON response must be an object",
    );
    await assert.rejects(
      client.health(),
      (error: unknown) => error instanceof KCoralError && error.statusCode === 500,
    );
  } finally {
    await server.close();
  }
  const gpu = fakeServer(() => json(bodies[0]));
  try {
    await using client = new Client(gpu.url);
    assert.deepEqual(await client.target(), { arch: "sm_90a" });
    assert.equal(gpu.received[0].path, "/health");
  } finally {
    await gpu.close();
  }
});

Deno.test("client: `await using` closes the client", async () => {
  const server = fakeServer(() => json('{"status":"ok"}'));
  let escaped: Client;
  try {
    {
      await using client = new Client(server.url);
      escaped = client;
      await client.health();
    }
    await assert.rejects(
      escaped.health(),
      (error: unknown) =>
        error instanceof TransportError && error.message === "the client has been closed",
    );
    assert.equal(server.received.length, 1);
  } finally {
    await server.close();
  }
});

Deno.test("client: with HTTP_PROXY set, the connect probe targets the proxy fetch uses", async () => {
  const proxy = fakeServer(() => json('{"status":"ok","via":"proxy"}'));
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const closedPort = (listener.addr as Deno.NetAddr).port;
  listener.close();
  // Each client runs in a child process with its own proxy variables: setting them here would
  // reach every test running in parallel in this process (and the programs they start).
  const probe = async (proxyEnv: Record<string, string>) => {
    const env = Deno.env.toObject();
    for (const name of Object.keys(env)) {
      if (/^(https?|all|no)_proxy$/i.test(name)) delete env[name];
    }
    const { stdout, success } = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", _HEALTH_PROBE, `http://127.0.0.1:${closedPort}`],
      env: { ...env, ...proxyEnv },
      clearEnv: true,
      stderr: "inherit",
    }).output();
    assert.ok(success);
    return JSON.parse(new TextDecoder().decode(stdout));
  };
  try {
    // The origin is down, but every request goes through the (live) proxy.
    assert.deepEqual(await probe({ HTTP_PROXY: proxy.url }), { via: "proxy" });
    assert.equal(proxy.received.length, 1);
    // NO_PROXY exempts the host: the probe goes to the origin, which refuses.
    assert.deepEqual(
      await probe({ HTTP_PROXY: proxy.url, NO_PROXY: "localhost,127.0.0.1" }),
      { error: "TransportError" },
    );
    assert.equal(proxy.received.length, 1);
  } finally {
    await proxy.close();
  }
});

Deno.test("client: a program sent whole on a kept connection that ends unanswered is never sent again", async () => {
  // The server answers /health on a kept connection, then takes the POST /execute, "runs" it
  // and drops the connection: whether it ran is unknown, so it is a TransportError, not a rerun.
  for (const transport of ["auto", "fetch"] as const) {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const posts: string[] = [];
    const serving = (async () => {
      for await (const conn of listener) {
        (async () => {
          const buf = new Uint8Array(1 << 16);
          let data = "";
          try {
            for (;;) {
              const n = await conn.read(buf);
              if (n === null) return;
              data += new TextDecoder().decode(buf.subarray(0, n));
              const end = data.indexOf("\r\n\r\n");
              if (end < 0) continue;
              const length = Number(/content-length: (\d+)/i.exec(data.slice(0, end))?.[1] ?? 0);
              if (data.length < end + 4 + length) continue;
              if (data.startsWith("GET /health")) {
                const body = '{"status":"ok"}';
                await conn.write(new TextEncoder().encode(
                  `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
                ));
                data = data.slice(end + 4 + length);
                continue;
              }
              posts.push(data.split("\r\n")[0]);
              await new Promise((r) => setTimeout(r, 50)); // it "runs", then the line drops
              return;
            }
          } finally {
            conn.close();
          }
        })();
      }
    })();
    try {
      await using client = new Client(`http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`, {
        transport,
      });
      await client.health(); // a kept connection
      const program = new Program();
      program.return_({
        key: "x",
        value: program.upload({ kind: "bytes", value: new Uint8Array(1) }),
      });
      await assert.rejects(client.execute(program), TransportError, transport);
      assert.deepEqual(posts, ["POST /execute HTTP/1.1"], transport);
    } finally {
      listener.close();
      await serving.catch(() => {});
    }
  }
});

Deno.test("client: both transports reach the same paths; URL credentials are Basic auth", async () => {
  const server = fakeServer(() => json('{"status":"ok"}'));
  try {
    const { port } = new URL(server.url);
    const base = `http://u:p%40w@127.0.0.1:${port}/prefix/?token=abc#frag`;
    for (const transport of ["auto", "fetch"] as const) {
      await using client = new Client(base, { transport });
      await client.health();
      const got = server.received.at(-1)!;
      assert.equal(got.path, "/prefix/health", transport);
      assert.equal(got.headers.get("authorization"), `Basic ${btoa("u:p@w")}`, transport);
    }
    // An explicit authorization header wins over the URL's credentials.
    await using explicit = new Client(base, { headers: { authorization: "Bearer t" } });
    await explicit.health();
    assert.equal(server.received.at(-1)!.headers.get("authorization"), "Bearer t");
  } finally {
    await server.close();
  }
});

Deno.test("client: an execute a server never answers is abandoned by its signal", async () => {
  // Accepts, reads, never answers (the protocol has no response timeout of its own).
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const held: Deno.Conn[] = [];
  const serving = (async () => {
    for await (const conn of listener) {
      held.push(conn);
      (async () => {
        const buf = new Uint8Array(65536);
        while ((await conn.read(buf).catch(() => null)) !== null) { /* swallow */ }
      })();
    }
  })();
  try {
    const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
    for (const transport of ["auto", "fetch"] as const) {
      await using client = new Client(url, { transport });
      const program = new Program();
      program.return_({
        key: "x",
        value: program.upload({ kind: "bytes", value: new Uint8Array(1) }),
      });
      // The signal's abort settles the call, before a guard that only a hung call reaches.
      let guard: ReturnType<typeof setTimeout> | undefined;
      const outcome = await Promise.race([
        client.execute(program, { signal: AbortSignal.timeout(200) }).then(
          () => "answered",
          (error) => error,
        ),
        new Promise((resolve) => guard = setTimeout(() => resolve("hung"), 5000)),
      ]).finally(() => clearTimeout(guard));
      assert.ok(
        outcome instanceof DOMException && outcome.name === "TimeoutError",
        `${transport}: ${outcome}`,
      );
      // An aborted signal stops the call before anything is sent.
      const aborted = AbortSignal.abort(new Error("stop"));
      await assert.rejects(client.execute(program, { signal: aborted }), /stop/);
    }
  } finally {
    listener.close();
    for (const conn of held) conn.close();
    await serving.catch(() => {});
  }
});

Deno.test("client: a connection that never opens is cut by connectTimeoutSeconds", async () => {
  // Simulate a silent network: connect attempts hang until aborted.
  const original = Deno.connect;
  let attempts = 0;
  Deno.connect = ((options: Deno.ConnectOptions) => {
    attempts++;
    return new Promise((_resolve, reject) => {
      options.signal?.addEventListener("abort", () => reject(options.signal!.reason));
    });
  }) as unknown as typeof Deno.connect;
  let guard: ReturnType<typeof setTimeout> | undefined;
  try {
    await using client = new Client("http://192.0.2.1:8000", { connectTimeoutSeconds: 0.2 });
    // The connect timeout settles the call, before a guard that only a hung call reaches.
    const outcome = await Promise.race([
      client.health().then(() => "answered", (error) => error),
      new Promise((resolve) => guard = setTimeout(() => resolve("hung"), 3000)),
    ]);
    assert.ok(outcome instanceof TransportError, String(outcome));
    assert.equal(outcome.message, "timed out connecting to 192.0.2.1:8000 after 0.2 s");
    assert.equal(attempts, 1);
  } finally {
    clearTimeout(guard);
    Deno.connect = original;
  }
});
