/**
 * What upstream KCoral's own tests expect of a server, beyond the wire format: the event log's
 * records as upstream writes them, upstream's message texts, and the worker-side `kcoral`
 * modules that uploaded code written for upstream imports.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { callProgram, postProgram, startServer, type TestServer } from "./_server.ts";

type Json = Record<string, unknown>;

function runEvents(logDir: string): Json[] {
  const runs = [...Deno.readDirSync(`${logDir}/runs`)];
  assert.equal(runs.length, 1);
  return Deno.readTextFileSync(`${logDir}/runs/${runs[0].name}/events.jsonl`).trim().split("\n")
    .map((line) => JSON.parse(line));
}

function finishedOf(events: Json[], requestId: unknown): Json[] {
  return events.filter((e) => e.event === "request_finished" && e.request_id === requestId);
}

Deno.test("upstream events: accepted workload, rejected, timeout, crash and its output", async (t) => {
  const logDir = await Deno.makeTempDir({ prefix: "kcoral-events-" });
  let server: TestServer | null = await startServer({
    logDir,
    maxRequestsPerWorker: 0,
    workerTerminationGraceSeconds: 1,
  });
  const ids: Record<string, unknown> = {};
  try {
    await t.step("requests", async () => {
      const s = server!;
      const accepted = await postProgram(s.url, {
        ...callProgram("def f():\n    return 1\n", "f"),
        options: { timeout_seconds: 12 },
      });
      ids.accepted = accepted.json.request_id;
      const rejected = await postProgram(s.url, { instructions: [] });
      assert.equal(rejected.status, 400);
      ids.rejected = rejected.json.request_id;
      const timeout = await postProgram(s.url, {
        ...callProgram("import time\ndef f():\n    time.sleep(30)\n", "f"),
        options: { timeout_seconds: 0.5 },
      });
      assert.equal(timeout.status, 504);
      ids.timeout = timeout.json.request_id;
      const crash = await postProgram(s.url, {
        instructions: [
          {
            op: "upload",
            id: "m",
            kind: "module",
            source: "import os\ndef boom():\n" +
              "    os.write(2, b'fatal: simulated device-side assert\\n')\n    os._exit(1)\n",
          },
          { op: "get_function", id: "f", module: { $ref: "m" }, name: "boom" },
          { op: "run", id: "boom", fn: { $ref: "f" } },
        ],
      });
      assert.equal(crash.status, 200);
      assert.equal(crash.json.status, "FAILED");
      ids.crash = crash.json.request_id;
    });
  } finally {
    await server.stop();
    server = null;
  }
  const events = runEvents(logDir);
  try {
    await t.step("request_received: the client's host and the raw Content-Length", () => {
      const received = events.find((e) =>
        e.event === "request_received" && e.request_id === ids.accepted
      )!;
      assert.equal(received.client, "127.0.0.1");
      assert.equal(typeof received.content_length, "string");
    });

    await t.step("request_accepted counts only what the program has", () => {
      const accepted = events.find((e) =>
        e.event === "request_accepted" && e.request_id === ids.accepted
      )!;
      assert.deepEqual(accepted.ops, { upload: 1, get_function: 1, run: 1, return: 1 });
      assert.deepEqual(accepted.uploads, { module: 1 });
      assert.equal(accepted.blob_bytes, null);
      assert.equal(accepted.timeout_seconds, 12);
      assert.equal(accepted.instructions, 4);
      const finished = finishedOf(events, ids.accepted);
      assert.equal(finished.length, 1);
      assert.equal(finished[0].exitcode, null);
      assert.equal(finished[0].output_tail, null);
    });

    await t.step("an invalid request is rejected as invalid_request (WARNING)", () => {
      const finished = finishedOf(events, ids.rejected);
      assert.equal(finished.length, 1);
      assert.equal(finished[0].level, "WARNING");
      assert.equal(finished[0].http_status, 400);
      assert.equal(finished[0].finish_reason, "rejected");
      assert.equal(finished[0].error_kind, "invalid_request");
      assert.equal(
        events.some((e) => e.event === "request_accepted" && e.request_id === ids.rejected),
        false,
      );
    });

    await t.step("a timed-out request finishes once, with its worker", () => {
      const finished = finishedOf(events, ids.timeout);
      assert.equal(finished.length, 1, JSON.stringify(finished));
      assert.equal(finished[0].level, "WARNING");
      assert.equal(finished[0].finish_reason, "timeout");
      assert.equal(finished[0].http_status, 504);
      assert.equal(finished[0].worker_id, "cpu/w0");
      assert.equal(finished[0].timeout_seconds, 0.5);
      const retired = events.filter((e) => e.event === "worker_retired");
      assert.ok(retired.some((e) => e.reason === "timeout"));
    });

    await t.step("a crash keeps the program's last output in output_tail", () => {
      const finished = finishedOf(events, ids.crash);
      assert.equal(finished.length, 1);
      const record = finished[0];
      assert.equal(record.level, "ERROR");
      assert.equal(record.finish_reason, "crashed");
      assert.equal(record.status, "FAILED");
      assert.equal(record.exitcode, 1);
      assert.equal(record.instruction_op, "run");
      assert.equal(record.instruction_id, "boom");
      assert.equal(record.output_tail, "[err] fatal: simulated device-side assert\n");
      assert.ok(events.some((e) => e.event === "worker_retired" && e.reason === "crashed"));
      const run = [...Deno.readDirSync(`${logDir}/runs`)][0].name;
      assert.deepEqual([...Deno.readDirSync(`${logDir}/runs/${run}/output`)], []);
    });
  } finally {
    await Deno.remove(logDir, { recursive: true });
  }
});

Deno.test("upstream messages: a tensor blob of the wrong length", async () => {
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 1,
  });
  try {
    const bytes = new TextEncoder().encode("abc");
    const sha = createHash("sha256").update(bytes).digest("hex");
    const { status, json } = await postProgram(server.url, {
      instructions: [
        { op: "upload", id: "x", kind: "tensor", blob: sha, dtype: "float32", shape: [1] },
      ],
    }, { blobs: { [sha]: bytes } });
    assert.equal(status, 400);
    assert.deepEqual(json.error, {
      kind: "parse",
      message: "tensor upload 'x' expects 4 bytes, got 3",
    });
    // From the cache as well (nothing supplied): the same check, before any CACHE_MISS.
    const again = await postProgram(server.url, {
      instructions: [
        { op: "upload", id: "y", kind: "tensor", blob: sha, dtype: "int8", shape: [2] },
      ],
    });
    assert.equal(again.status, 400, JSON.stringify(again.json));
    assert.equal((again.json.error as Json).message, "tensor upload 'y' expects 2 bytes, got 3");
  } finally {
    await server.stop();
  }
});

Deno.test("upstream worker modules: kcoral.errors and kcoral.builtins in uploaded code", async (t) => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  const failure = async (source: string) => {
    const { status, json } = await postProgram(server.url, callProgram(source, "f"));
    assert.equal(status, 200, JSON.stringify(json));
    assert.equal(json.status, "FAILED", JSON.stringify(json));
    return json.error as Json;
  };
  try {
    await t.step("ExecutionError keeps its kind and message", async () => {
      const error = await failure(
        "from kcoral.errors import ExecutionError\n" +
          "def f():\n    raise ExecutionError('correctness', 'outputs differ: 3 != 4')\n",
      );
      assert.equal(error.kind, "correctness");
      assert.equal(error.message, "outputs differ: 3 != 4");
      assert.equal(error.instruction_op, "run");
    });

    await t.step(
      "the client-side error classes import; a module-level import works too",
      async () => {
        const { json } = await postProgram(
          server.url,
          callProgram(
            "import kcoral.errors as errors\n" +
              "from kcoral.builtins import benchmark, compile_tirx\n" +
              "def f():\n" +
              "    e = errors.KCoralError(503, 'server saturated', kind='busy')\n" +
              "    return [str(e), errors.GPUAccessViolation.__mro__[1] is errors.ExecutionError,\n" +
              "            callable(benchmark), callable(compile_tirx)]\n",
            "f",
          ),
        );
        assert.equal(json.status, "COMPLETED", JSON.stringify(json));
        assert.deepEqual(
          (json.results as { out: { value: { value: unknown }[] } }).out.value.map((v) => v.value),
          ["HTTP 503: server saturated", true, true, true],
        );
      },
    );

    await t.step("compile_tirx without tvm: unavailable, upstream's message", async () => {
      const error = await failure(
        "from kcoral.builtins import compile_tirx\ndef f():\n    return compile_tirx(None)\n",
      );
      assert.equal(error.kind, "unavailable");
      assert.equal(
        error.message,
        "server-side compilation requires tvm, which is not installed on this server",
      );
    });

    await t.step(
      "benchmark: a non-callable is a runtime error; no GPU is unavailable",
      async () => {
        const notCallable = await failure(
          "from kcoral.builtins import benchmark\ndef f():\n    return benchmark(3, {'warmup': 1})\n",
        );
        assert.equal(notCallable.kind, "runtime");
        assert.equal(notCallable.message, "benchmark expects a compiled module handle");
        const noGpu = await failure(
          "from kcoral.builtins import benchmark\ndef f():\n    return benchmark(lambda: None)\n",
        );
        assert.equal(noGpu.kind, "unavailable");
      },
    );
  } finally {
    await server.stop();
  }
});

Deno.test("upstream worker modules: a real kcoral installation on the worker wins", async () => {
  const site = await Deno.makeTempDir({ prefix: "kcoral-site-" });
  await Deno.mkdir(`${site}/kcoral`);
  await Deno.writeTextFile(`${site}/kcoral/__init__.py`, "REAL = True\n");
  await Deno.writeTextFile(
    `${site}/kcoral/errors.py`,
    "class ExecutionError(Exception):\n" +
      "    def __init__(self, kind, message):\n" +
      "        super().__init__(message)\n" +
      "        self.kind = kind\n" +
      "        self.message = message\n",
  );
  const env = { ...Deno.env.toObject(), PYTHONPATH: site };
  const server = await startServer({}, { env });
  try {
    const { json } = await postProgram(
      server.url,
      callProgram(
        "import kcoral\nfrom kcoral.errors import ExecutionError\n" +
          "def f():\n    assert kcoral.REAL\n    raise ExecutionError('compile', 'from the real one')\n",
        "f",
      ),
    );
    assert.equal(json.status, "FAILED", JSON.stringify(json));
    const error = json.error as Json;
    assert.equal(error.kind, "compile", JSON.stringify(error));
    assert.equal(error.message, "from the real one");
  } finally {
    await server.stop();
    await Deno.remove(site, { recursive: true });
  }
});

Deno.test("upstream events: a worker that cannot start: worker_failed (startup), server_start_failed", async () => {
  const scratch = await Deno.makeTempDir({ prefix: "kcoral-badsite-" });
  // Every worker interpreter fails as it starts (the server's own questions still get answers).
  await Deno.writeTextFile(
    `${scratch}/sitecustomize.py`,
    "import sys\nif '-m' in sys.orig_argv:\n" +
      "    sys.stderr.write('simulated runtime init failure\\n')\n    sys.exit(3)\n",
  );
  const logDir = `${scratch}/logs`;
  try {
    await assert.rejects(() =>
      startServer({ logDir }, { env: { ...Deno.env.toObject(), PYTHONPATH: scratch } })
    );
    const events = runEvents(logDir);
    assert.ok(events.some((e) => e.event === "server_started"));
    const failed = events.find((e) => e.event === "worker_failed")!;
    assert.equal(failed.level, "ERROR");
    assert.equal(failed.phase, "startup");
    assert.equal(failed.worker_id, "cpu/w0");
    const startFailed = events.find((e) => e.event === "server_start_failed")!;
    assert.equal(startFailed.level, "ERROR");
    assert.match(String(startFailed.error), /^\w+: /);
    assert.match(`${startFailed.error}${startFailed.traceback}`, /simulated runtime init failure/);
  } finally {
    await Deno.remove(scratch, { recursive: true });
  }
});

Deno.test("upstream messages: a GPU set whose worker start outlasts the timeout: 504", async () => {
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0, 1],
    workersPerGpu: 1,
  });
  try {
    const { status, json } = await postProgram(server.url, {
      ...callProgram("def f():\n    return 1\n", "f"),
      options: { gpu_count: 2, timeout_seconds: 0.001 },
    });
    assert.equal(status, 504);
    assert.deepEqual(json.error, {
      kind: "timeout",
      message: "worker initialization exceeded the execution timeout",
    });
    // The set is given back: a request after it runs.
    const next = await postProgram(server.url, {
      ...callProgram("def f():\n    return 1\n", "f"),
      options: { gpu_count: 2 },
    });
    assert.equal(next.json.status, "COMPLETED", JSON.stringify(next.json));
  } finally {
    await server.stop();
  }
});
