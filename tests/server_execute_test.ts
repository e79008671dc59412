/**
 * The execution server over real HTTP on loopback with real Python workers, in CPU and
 * simulated-GPU modes (issue 3).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Client, Program } from "../mod.ts";
import { appInternals } from "../server/app.ts";
import { callProgram, MODES, multipartBody, postProgram, startServer } from "./_server.ts";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

for (const mode of MODES) {
  Deno.test(`server (${mode.name}): health, programs, failures, capture, files`, async (t) => {
    const server = await startServer({ ...mode.config, maxRequestsPerWorker: 0 });
    const client = new Client(server.url);
    try {
      await t.step("health has the exact shape", async () => {
        const response = await fetch(`${server.url}/health`);
        assert.equal(response.status, 200);
        const text = await response.text();
        const body = JSON.parse(text);
        assert.deepEqual(Object.keys(body), [
          "status",
          "instance_id",
          "started_at",
          "gpu_count",
          "load",
          "target",
          "versions",
        ]);
        assert.equal(body.status, "ok");
        assert.match(body.instance_id, UUID);
        assert.match(body.started_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
        assert.deepEqual(body.load, {
          request_capacity: 1,
          requests_in_progress: 0,
          requests_waiting: 0,
        });
        if (mode.name === "cpu") {
          assert.equal(body.gpu_count, 0);
          assert.deepEqual(body.target, {});
        } else {
          assert.equal(body.gpu_count, 1);
          assert.deepEqual(body.target, { arch: "simulated" });
          assert.equal(body.versions.simulated, "cpu");
          assert.ok(body.versions.torch);
        }
      });

      await t.step("scalar program: 41 -> 42, typed, X-Request-ID equals the body id", async () => {
        const { status, headers, json } = await postProgram(
          server.url,
          callProgram("def f(x):\n    return x + 1\n", "f", [41]),
        );
        assert.equal(status, 200);
        assert.equal(json.status, "COMPLETED");
        assert.deepEqual(json.results, { out: { type: "integer", value: 42 } });
        assert.equal(headers.get("x-request-id"), json.request_id);
        assert.match(String(json.request_id), UUID);
        assert.equal("error" in json, false);
        for (const key of ["queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"]) {
          assert.equal(typeof json[key], "number");
        }
      });

      await t.step(
        "a canonical client X-Request-ID is kept; anything else is replaced",
        async () => {
          const id = crypto.randomUUID();
          const kept = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"), {
            headers: { "x-request-id": id },
          });
          assert.equal(kept.json.request_id, id);
          assert.equal(kept.headers.get("x-request-id"), id);
          const upper = await postProgram(
            server.url,
            callProgram("def f():\n    return 1\n", "f"),
            {
              headers: { "x-request-id": id.toUpperCase() },
            },
          );
          assert.notEqual(upper.json.request_id, id.toUpperCase());
          assert.match(String(upper.json.request_id), UUID);
        },
      );

      await t.step("tensor round trip: CACHE_MISS, then a cache hit", async () => {
        const program = new Program();
        const mod = program.upload({
          kind: "module",
          source: "def add_one(x):\n    return x + 1\n",
        });
        const fn = program.getFunction({ module: mod, name: "add_one" });
        const values = new Float32Array([1, 2, 3, 4, Math.random()]);
        const x = program.upload({ kind: "tensor", value: values, shape: [5] });
        const y = program.run({ fn, args: [x] });
        program.return_({ key: "y", value: y });
        const missesBefore = server.events.filter((e) => e.finish_reason === "cache_miss").length;
        const first = await client.execute(program);
        const misses = server.events.filter((e) => e.finish_reason === "cache_miss").length;
        if (mode.name === "cpu") {
          assert.equal(first.status, "FAILED");
          assert.equal(first.error?.kind, "unavailable");
          return;
        }
        assert.equal(first.status, "COMPLETED", JSON.stringify(first.error));
        assert.equal(misses, missesBefore + 1);
        const tensor = first.get("y") as unknown as {
          dtype: string;
          shape: number[];
          data: Float32Array;
        };
        assert.equal(tensor.dtype, "float32");
        assert.deepEqual(tensor.shape, [5]);
        assert.deepEqual([...tensor.data], [...values].map((v) => Math.fround(v + 1)));
        const second = await client.execute(program);
        assert.equal(second.status, "COMPLETED");
        assert.equal(
          server.events.filter((e) => e.finish_reason === "cache_miss").length,
          misses,
          "the second run must hit the memory cache",
        );
      });

      await t.step(
        "FAILED: earlier returns kept, later ones skipped; user error -> engine",
        async () => {
          const program = new Program();
          const mod = program.upload({
            kind: "module",
            source:
              "def ok():\n    return 'kept'\n\ndef bad():\n    raise ValueError('bad input')\n",
          });
          const ok = program.getFunction({ module: mod, name: "ok" });
          const bad = program.getFunction({ module: mod, name: "bad" });
          program.return_({ key: "first", value: program.run({ fn: ok }) });
          const failing = program.run({ fn: bad });
          program.return_({ key: "never", value: failing });
          const result = await client.execute(program);
          assert.equal(result.status, "FAILED");
          assert.equal(result.get("first"), "kept");
          assert.equal(result.results.has("never"), false);
          assert.equal(result.error?.kind, "engine");
          assert.equal(result.error?.message, "ValueError: bad input");
          assert.equal(result.error?.instructionIndex, 5);
          assert.equal(result.error?.instructionOp, "run");
          assert.match(result.error?.traceback ?? "", /raise ValueError\('bad input'\)/);
        },
      );

      await t.step("a syntax error in a module is kind parse", async () => {
        const program = new Program();
        program.upload({ kind: "module", source: "def broken(:\n" });
        const result = await client.execute(program);
        assert.equal(result.status, "FAILED");
        assert.equal(result.error?.kind, "parse");
        assert.equal(result.error?.instructionIndex, 0);
      });

      await t.step("output capture keeps the head of each stream, up to the limit", async () => {
        const program = new Program();
        const mod = program.upload({
          kind: "module",
          source: "import os, sys\n" +
            "def go():\n    print('0123456789abcdef')\n    sys.stdout.flush()\n" +
            "    os.write(2, b'ERR-0123456789')\n    return 1\n",
        });
        program.run({ fn: program.getFunction({ module: mod, name: "go" }) });
        const result = await client.execute(program, { outputLimitBytes: 8 });
        assert.equal(result.status, "COMPLETED");
        assert.equal(result.stdout, "01234567");
        assert.equal(result.stdoutTruncated, true);
        assert.equal(result.stderr, "ERR-0123");
        assert.equal(result.stderrTruncated, true);
        const untouched = await client.execute(program);
        assert.equal(untouched.stdout, "0123456789abcdef\n");
        assert.equal(untouched.stdoutTruncated, false);
      });

      await t.step("file and folder returns survive a later failure", async () => {
        const program = new Program();
        program.uploadFile({ blob: new TextEncoder().encode("input"), path: "in/data.txt" });
        const mod = program.upload({
          kind: "module",
          source: "import os\n" +
            "def write():\n" +
            "    os.makedirs('out/empty', exist_ok=True)\n" +
            "    os.makedirs('out/sub', exist_ok=True)\n" +
            "    open('out/.hidden', 'w').write('h')\n" +
            "    open('out/sub/b.bin', 'wb').write(bytes([0, 255]))\n" +
            "    open('report.txt', 'w').write(open('in/data.txt').read() + '!')\n" +
            "def fail():\n    raise RuntimeError('later')\n",
        });
        program.run({ fn: program.getFunction({ module: mod, name: "write" }) });
        program.returnFile({ key: "report", path: "report.txt" });
        program.returnFolder({ key: "out", path: "out" });
        program.run({ fn: program.getFunction({ module: mod, name: "fail" }) });
        const result = await client.execute(program);
        assert.equal(result.status, "FAILED");
        assert.equal(result.error?.message, "RuntimeError: later");
        const report = result.get("report") as { text(): string };
        assert.equal(report.text(), "input!");
        const folder = result.get("out") as {
          files: ReadonlyMap<string, { bytes(): Uint8Array }>;
          directories: readonly string[];
        };
        assert.deepEqual([...folder.files.keys()], [".hidden", "sub/b.bin"]);
        assert.deepEqual([...folder.directories], ["empty", "sub"]);
        assert.deepEqual([...folder.files.get("sub/b.bin")!.bytes()], [0, 255]);
      });

      await t.step("unsafe paths are rejected with 400 parse", async () => {
        for (const path of ["../escape.txt", "/etc/passwd", "a\\b"]) {
          const bytes = new TextEncoder().encode("x");
          const sha = _sha256(bytes);
          const { status, json } = await postProgram(server.url, {
            instructions: [{ op: "upload", id: "f", kind: "file", blob: sha, path }],
          }, { blobs: { [sha]: bytes } });
          assert.equal(status, 400, path);
          assert.equal((json.error as { kind: string }).kind, "parse");
        }
      });
    } finally {
      client.close();
      await server.stop();
    }
  });
}

Deno.test("server: malformed requests get 400/413 with the spec's kind, and serving goes on", async (t) => {
  const server = await startServer({ maxRequestBytes: 4096, maxRequestsPerWorker: 0 });
  try {
    const post = async (
      body: Uint8Array<ArrayBuffer> | string,
      contentType: string,
      headers = {},
    ) => {
      const response = await fetch(`${server.url}/execute`, {
        method: "POST",
        body,
        headers: { "content-type": contentType, ...headers },
      });
      return { status: response.status, headers: response.headers, json: await response.json() };
    };
    await t.step("not multipart", async () => {
      const r = await post("{}", "application/json");
      assert.equal(r.status, 400);
      assert.equal(r.json.status, "ERROR");
      assert.equal(r.json.error.kind, "parse");
      assert.equal(r.headers.get("x-request-id"), r.json.request_id);
    });
    await t.step("duplicate keys in the program JSON", async () => {
      const { body, contentType } = multipartBody([{
        name: "program",
        contentType: "application/json",
        body: '{"instructions":[],"instructions":[]}',
      }]);
      const r = await post(body, contentType);
      assert.equal(r.status, 400);
      assert.match(r.json.error.message, /duplicate/);
    });
    await t.step("unknown op", async () => {
      const r = await postProgram(server.url, { instructions: [{ op: "frobnicate" }] });
      assert.equal(r.status, 400);
      assert.match(String((r.json.error as { message: string }).message), /op/);
    });
    await t.step("unreferenced blob part", async () => {
      const bytes = new Uint8Array([1, 2, 3]);
      const sha = _sha256(bytes);
      const r = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"), {
        blobs: { [sha]: bytes },
      });
      assert.equal(r.status, 400);
      assert.equal(
        (r.json.error as { message: string }).message,
        `unreferenced blob part(s): ${sha}`,
      );
    });
    await t.step("tensor blob length mismatch", async () => {
      const bytes = new Uint8Array(12);
      const sha = _sha256(bytes);
      const r = await postProgram(server.url, {
        instructions: [{
          op: "upload",
          id: "t",
          kind: "tensor",
          blob: sha,
          dtype: "float32",
          shape: [4],
        }],
      }, { blobs: { [sha]: bytes } });
      assert.equal(r.status, 400);
      assert.equal(
        (r.json.error as { message: string }).message,
        "tensor upload 't' expects 16 bytes, got 12",
      );
    });
    await t.step("gpu_count on a CPU server", async () => {
      const r = await postProgram(server.url, {
        ...callProgram("def f():\n    return 1\n", "f"),
        options: { gpu_count: 1 },
      });
      assert.equal(r.status, 400);
      assert.equal(
        (r.json.error as { message: string }).message,
        "gpu_count exceeds this GPU server's configured capacity",
      );
    });
    await t.step("413 from Content-Length, before reading", async () => {
      const r = await post(new Uint8Array(5000), "multipart/form-data; boundary=x");
      assert.equal(r.status, 413);
      assert.deepEqual(r.json.error, {
        kind: "request_too_large",
        message: "request exceeds the configured size limit",
      });
    });
    await t.step("413 after reading a body without Content-Length", async () => {
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          for (let i = 0; i < 10; i++) controller.enqueue(new Uint8Array(1000));
          controller.close();
        },
      });
      const response = await fetch(`${server.url}/execute`, {
        method: "POST",
        body: stream,
        headers: { "content-type": "multipart/form-data; boundary=x" },
      });
      assert.equal(response.status, 413);
      assert.equal((await response.json()).error.kind, "request_too_large");
    });
    await t.step("the server still serves", async () => {
      const r = await postProgram(server.url, callProgram("def f():\n    return 7\n", "f"));
      assert.equal(r.status, 200);
      assert.deepEqual(r.json.results, { out: { type: "integer", value: 7 } });
    });
  } finally {
    await server.stop();
  }
});

Deno.test("server: an integer longer than Python converts is a 400, and the worker lives on", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  try {
    const pid = async () => {
      const source = "import os\ndef f():\n    return os.getpid()\n";
      const r = await postProgram(server.url, callProgram(source, "f"));
      assert.equal(r.status, 200, JSON.stringify(r.json));
      return (r.json.results as { out: { value: number } }).out.value;
    };
    const before = await pid();
    const program = JSON.stringify(callProgram("def f(x):\n    return 1\n", "f", [0]))
      .replace("[0]", `[${"7".repeat(4301)}]`);
    const r = await postProgram(server.url, program);
    assert.equal(r.status, 400, JSON.stringify(r.json));
    const error = r.json.error as { kind: string; message: string };
    assert.equal(error.kind, "parse");
    assert.match(error.message, /^malformed JSON: Exceeds the limit \(4300 digits\)/);
    assert.equal(await pid(), before);
  } finally {
    await server.stop();
  }
});

Deno.test("server: a body cut short is a 400 parse with its request id, not an unhandled error", async () => {
  const server = await startServer();
  try {
    const { hostname, port } = new URL(server.url);
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f():\n    return 1\n", "f")),
    }]);
    const conn = await Deno.connect({ hostname, port: Number(port) });
    await conn.write(new TextEncoder().encode(
      `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: ${contentType}\r\n` +
        `content-length: ${body.length + 10}\r\n\r\n`,
    ));
    await conn.write(body);
    await conn.closeWrite(); // ten bytes short, and no more to come
    const answer = new Uint8Array(4096);
    let text = "";
    for (;;) {
      const n = await conn.read(answer);
      if (n === null) break;
      text += new TextDecoder().decode(answer.subarray(0, n));
    }
    conn.close();
    assert.match(text, /^HTTP\/1\.1 400 /);
    const json = JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4));
    assert.equal(json.error.kind, "parse");
    assert.match(json.error.message, /^the request body could not be read: /);
    assert.match(json.request_id, /^[0-9a-f-]{36}$/);
    const finished = server.events.find((e) => e.event === "request_finished")!;
    assert.equal(finished.level, "WARNING");
    assert.equal(finished.request_id, json.request_id);
    assert.equal(finished.http_status, 400);
    assert.equal(server.events.some((e) => e.error_kind === "unhandled"), false);
  } finally {
    await server.stop();
  }
});

Deno.test("server: /internal/worker-status answers GET from loopback, 405 to other methods", async () => {
  const server = await startServer({ numWorkers: 2 });
  try {
    const response = await fetch(`${server.url}/internal/worker-status`);
    assert.equal(response.status, 200);
    const status = await response.json();
    assert.deepEqual(Object.keys(status), [
      "status",
      "instance_id",
      "target",
      "versions",
      "worker_count",
      "busy_workers",
    ]);
    assert.equal(status.worker_count, 2);
    assert.equal(status.busy_workers, 0);
    for (const method of ["POST", "PUT", "DELETE"]) {
      const other = await fetch(`${server.url}/internal/worker-status`, { method });
      assert.equal(other.status, 405, method);
      assert.equal(other.headers.get("allow"), "GET");
      await other.body?.cancel();
    }
  } finally {
    await server.stop();
  }
});

Deno.test("server: a program posing as the zygote on its channel cannot fake its own exit", async () => {
  // The program writes a frame "exited" for its child id straight into its channel to the
  // zygote. Forwarded frames are tagged by the zygote as the child's, so the server never takes
  // it for the zygote's own: it is a frame no worker sends (500, invalid worker response, the
  // worker retired), not a child that seems gone while it still runs.
  const server = await startServer();
  try {
    const source = [
      "import json, os, stat, struct, time",
      "def f():",
      "    for name in os.listdir('/proc/self/fd'):",
      "        fd = int(name)",
      "        try:",
      "            if not stat.S_ISSOCK(os.fstat(fd).st_mode):",
      "                continue",
      "        except OSError:",
      "            continue",
      "        body = json.dumps({'t': 'exited', 'c': 1, 'code': 0, 'signal': None,",
      "                           'orphans': False, 'child': False}).encode()",
      "        try:",
      "            os.write(fd, struct.pack('>I', len(body)) + body)",
      "        except OSError:",
      "            pass",
      "    time.sleep(0.5)",
      "    return 7",
      "",
    ].join("\n");
    const r = await postProgram(server.url, callProgram(source, "f"));
    assert.equal(r.status, 500, JSON.stringify(r.json));
    assert.deepEqual(r.json.error, { kind: "engine", message: "invalid worker response" });
    // The seat serves on.
    const next = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"));
    assert.equal(next.status, 200, JSON.stringify(next.json));
  } finally {
    await server.stop();
  }
});

Deno.test("server: a crash's output_tail holds its own request's stderr, not an earlier one's", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  try {
    // With capture off, a program's stderr goes to the slot's own stderr (the diagnostics ring).
    const speak = (text: string, exit: boolean) => ({
      ...callProgram(
        `import os, sys\ndef f():\n    sys.stderr.write('${text}\\n')\n    sys.stderr.flush()\n` +
          (exit ? "    os._exit(3)\n" : "    return 1\n"),
        "f",
      ),
      options: { output_limit_bytes: 0 },
    });
    assert.equal((await postProgram(server.url, speak("EARLIER-REQUEST-LINE", false))).status, 200);
    await new Promise((r) => setTimeout(r, 100)); // the line reaches the ring
    const crashed = await postProgram(server.url, speak("THIS-REQUEST-LINE", true));
    assert.equal(crashed.status, 200);
    const id = crashed.json.request_id;
    const finished = server.events.find((e) =>
      e.event === "request_finished" && e.request_id === id
    )!;
    const tail = String(finished.output_tail);
    assert.match(tail, /THIS-REQUEST-LINE/);
    assert.doesNotMatch(tail, /EARLIER-REQUEST-LINE/);
  } finally {
    await server.stop();
  }
});

Deno.test("server: 503 busy when no worker frees up in time", async () => {
  const server = await startServer({ workerWaitTimeoutSeconds: 0.3 });
  try {
    const slow = postProgram(
      server.url,
      callProgram("import time\ndef f():\n    time.sleep(1.5)\n    return 1\n", "f"),
    );
    await _waitFor(() => server.app.health().load.requests_in_progress === 1);
    const busy = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"));
    assert.equal(busy.status, 503);
    assert.equal(busy.headers.get("retry-after"), "1");
    assert.deepEqual(busy.json.error, { kind: "busy", message: "server saturated" });
    assert.equal((await slow).status, 200);
  } finally {
    await server.stop();
  }
});

Deno.test("server: a timeout kills the whole process tree (504) and the next request works", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0, workerTerminationGraceSeconds: 0.5 });
  const pidFile = await Deno.makeTempFile();
  try {
    // The program and its grandchild each leave a file once their sleep is over: a kill before
    // that leaves neither (`&&`: a killed sleep never lets its shell write the file, whichever of
    // the two the kill reaches first).
    const source = "import subprocess, time\n" +
      "def f(path):\n" +
      "    p = subprocess.Popen(['sh', '-c', f'sleep 60 && echo done > {path}.grandchild'],\n" +
      "                         start_new_session=True)\n" +
      "    open(path, 'w').write(str(p.pid))\n" +
      "    time.sleep(60)\n" +
      "    open(path + '.program', 'w').write('done')\n";
    const program = callProgram(source, "f", [pidFile]);
    const r = await postProgram(server.url, { ...program, options: { timeout_seconds: 1 } });
    assert.equal(r.status, 504);
    assert.deepEqual(r.json.error, { kind: "timeout", message: "execution timed out" });
    const grandchild = Number(await Deno.readTextFile(pidFile));
    assert.ok(grandchild > 0);
    assert.equal(_alive(grandchild), false, "the setsid grandchild must be killed");
    for (const which of ["program", "grandchild"]) {
      assert.equal(
        await Deno.stat(`${pidFile}.${which}`).then(() => true, () => false),
        false,
        `the ${which} got past its sleep: the answer waited for it`,
      );
    }
    const next = await postProgram(server.url, callProgram("def f():\n    return 'fine'\n", "f"));
    assert.equal(next.status, 200);
    assert.deepEqual(next.json.results, { out: { type: "string", value: "fine" } });
  } finally {
    await server.stop();
    await Deno.remove(pidFile);
  }
});

Deno.test("server: os._exit inside an instruction -> 200 FAILED, and the next request succeeds", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  try {
    const r = await postProgram(
      server.url,
      callProgram("import os\ndef f():\n    os._exit(3)\n", "f"),
    );
    assert.equal(r.status, 200);
    assert.equal(r.json.status, "FAILED");
    assert.deepEqual(r.json.results, {});
    assert.deepEqual(r.json.error, {
      kind: "runtime",
      message: "worker exited while executing the instruction",
      instruction_index: 2,
      instruction_op: "run",
      instruction_id: "r",
      traceback: "",
    });
    const next = await postProgram(server.url, callProgram("def f():\n    return 2\n", "f"));
    assert.equal(next.status, 200);
    assert.equal(next.json.status, "COMPLETED");
  } finally {
    await server.stop();
  }
});

Deno.test("server: results over the response limit -> 500 response_too_large", async () => {
  const server = await startServer({ maxResponseBytes: 10_000 });
  try {
    const r = await postProgram(
      server.url,
      callProgram("def f():\n    return bytes(20000)\n", "f"),
    );
    assert.equal(r.status, 500);
    assert.deepEqual(r.json.error, {
      kind: "response_too_large",
      message: "results exceed the configured response-size limit",
    });
  } finally {
    await server.stop();
  }
});

Deno.test("server: answers beyond 64 MiB of JSON: whole under the limit, response_too_large over it", async () => {
  // One worker frame carries the answer's JSON: it used to be capped at 64 MiB, and a larger
  // one ended the slot (reported as the worker exiting mid-instruction).
  const big = "def f():\n    return 'a' * (70 << 20)\n";
  const within = await startServer(); // limit 256 MiB
  try {
    await using client = new Client(within.url);
    const program = new Program();
    const mod = program.upload({ kind: "module", source: big });
    program.return_({
      key: "s",
      value: program.run({ fn: program.getFunction({ module: mod, name: "f" }) }),
    });
    const result = await client.execute(program);
    assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
    assert.equal(result.get<string>("s").length, 70 << 20);
  } finally {
    await within.stop();
  }
  const over = await startServer({ maxResponseBytes: 48 << 20, maxRequestsPerWorker: 0 });
  try {
    const pid = async () => {
      const r = await postProgram(
        over.url,
        callProgram("import os\ndef f():\n    return os.getpid()\n", "f"),
      );
      return (r.json.results as { out: { value: number } }).out.value;
    };
    const before = await pid();
    for (const source of [big, "def f():\n    raise ValueError('e' * (70 << 20))\n"]) {
      const r = await postProgram(over.url, callProgram(source, "f"));
      assert.equal(r.status, 500, JSON.stringify(r.json).slice(0, 300));
      assert.equal((r.json.error as { kind: string }).kind, "response_too_large");
    }
    assert.equal(await pid(), before); // the worker was not lost over it
    // 40 MB of results JSON (quotes, each escaped), within the limit, but 80 MB once escaped
    // again inside a frame (over the frame limit of 64 MiB): sent whole, from a file.
    const quotes = await postProgram(
      over.url,
      callProgram("def f():\n    return '\"' * 20_000_000\n", "f"),
    );
    assert.equal(quotes.status, 200, JSON.stringify(quotes.json).slice(0, 300));
    assert.equal((quotes.json.results as { out: { value: string } }).out.value.length, 20_000_000);
    assert.equal(await pid(), before);
  } finally {
    await over.stop();
  }
});

Deno.test("server: fresh workers get a new pid per request; reused workers keep theirs", async () => {
  const source = "import os\ndef f():\n    return os.getpid()\n";
  for (const [max, same] of [[1, false], [0, true]] as const) {
    const server = await startServer({ maxRequestsPerWorker: max });
    try {
      const pids = [];
      for (let i = 0; i < 3; i++) {
        const r = await postProgram(server.url, callProgram(source, "f"));
        pids.push((r.json.results as { out: { value: number } }).out.value);
        await server.pool.settled();
      }
      assert.equal(new Set(pids).size === 1, same, `max_requests ${max}: ${pids}`);
    } finally {
      await server.stop();
    }
  }
});

Deno.test("server: the disk file cache survives a restart", async () => {
  const diskCacheDir = await Deno.makeTempDir();
  try {
    const content = new TextEncoder().encode(`persist ${crypto.randomUUID()}`);
    const program = new Program();
    const path = program.uploadFile({ blob: content, path: "data/p.txt" });
    const mod = program.upload({
      kind: "module",
      source: "def r(p):\n    return open(p).read()\n",
    });
    program.return_({
      key: "text",
      value: program.run({ fn: program.getFunction({ module: mod, name: "r" }), args: [path] }),
    });
    for (const round of [0, 1]) {
      const server = await startServer({ diskCacheDir });
      try {
        const result = await new Client(server.url).execute(program);
        assert.equal(result.get("text"), new TextDecoder().decode(content));
        const misses = server.events.filter((e) => e.finish_reason === "cache_miss").length;
        assert.equal(misses, round === 0 ? 1 : 0, `round ${round}`);
      } finally {
        await server.stop();
      }
    }
  } finally {
    await Deno.remove(diskCacheDir, { recursive: true });
  }
});

Deno.test("server: graceful shutdown finishes the request in flight and leaves no worker", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  const zygotes = server.pool.seats.map((s) => s.slot!.pid);
  const inFlight = postProgram(
    server.url,
    callProgram("import time\ndef f():\n    time.sleep(1)\n    return 'done'\n", "f"),
  );
  await _waitFor(() => server.app.health().load.requests_in_progress === 1);
  const stopping = server.stop();
  await _waitFor(() => server.app.health().load.request_capacity === 0);
  const refused = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"))
    .catch(() => null);
  if (refused) assert.equal(refused.status, 503);
  const finished = await inFlight;
  assert.equal(finished.status, 200);
  assert.deepEqual(finished.json.results, { out: { type: "string", value: "done" } });
  await stopping;
  for (const pid of zygotes) assert.equal(_alive(pid), false, `zygote ${pid} still alive`);
});

Deno.test("server: shutdown does not wait for an upload that stalls: it gets 503 busy", async () => {
  for (const length of [1000, 12 << 20]) { // held as it arrives; read in place
    const server = await startServer();
    const { hostname, port } = new URL(server.url);
    const conn = await Deno.connect({ hostname, port: Number(port) });
    try {
      await conn.write(new TextEncoder().encode(
        `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n` +
          `content-length: ${length}\r\n\r\n--b\r\n`,
      ));
      await _waitFor(() => server.events.some((e) => e.event === "request_received"));
      const stopped = await Promise.race([
        server.stop().then(() => true),
        new Promise<false>((r) => setTimeout(() => r(false), 10_000)),
      ]);
      assert.equal(stopped, true, `a stalled upload of ${length} bytes held the shutdown`);
      const answer = new Uint8Array(4096);
      const n = await conn.read(answer);
      const text = new TextDecoder().decode(answer.subarray(0, n ?? 0));
      assert.match(text, /^HTTP\/1\.1 503 /);
      assert.match(text, /"kind":"busy","message":"server saturated"/);
    } finally {
      conn.close();
      await server.server.closed; // the connection it still waited on is gone now
    }
  }
});

function _sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

function _alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

async function _waitFor(condition: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 10));
  }
}

Deno.test("server: an unexpected failure is a 500 engine body, and the server keeps serving", async () => {
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 1,
  });
  try {
    const blobDir = appInternals(server.app).blobDir!;
    assert.match(blobDir, /^\/dev\/shm\/kcoral-blobs-/);
    // The blob directory vanishes under the server: storing the next blob cannot work.
    await Deno.remove(blobDir, { recursive: true });
    const bytes = new Uint8Array([1, 2, 3, 4]);
    const sha = _sha256(bytes);
    const r = await postProgram(server.url, {
      instructions: [{ op: "upload", id: "b", kind: "bytes", blob: sha }],
    }, { blobs: { [sha]: bytes } });
    assert.equal(r.status, 500);
    assert.deepEqual(r.json.error, { kind: "engine", message: "internal server error" });
    assert.ok(server.events.some((e) => e.error_kind === "unhandled"));
    const next = await postProgram(server.url, callProgram("def f():\n    return 5\n", "f"));
    assert.equal(next.status, 200);
    assert.deepEqual(next.json.results, { out: { type: "integer", value: 5 } });
  } finally {
    await server.stop();
  }
});
