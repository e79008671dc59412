// Tests of `kcoral run TOOL` (issue 6): the CLI run as a process (`deno run -A cli.ts run
// ...`) against a live local server (tests/_server.ts, CPU mode, real Python workers), plus
// unit tests of the program builder, the exit status, and the progress display.
//
// The profilers are FAKE executables written into a temporary directory and put on the
// worker's PATH with `-e PATH=<dir>:...` (the runner keeps the worker Python's directory
// first, which holds no `ncu`, `compute-sanitizer` or `run-iket`). They record their argv
// on stdout and write the report or trace files a real profiler would. IKET in
// particular is not installable anywhere we can reach: `run-iket` here is such a stand-in
// that records its argv and writes `trace.json`. Real ncu and compute-sanitizer runs are
// in tests/gpu/cli_gpu.sh.

import assert from "node:assert/strict";
import { ProgramResult, TransportError } from "../client/mod.ts";
import { describeError } from "../cli/run/execute.ts";
import { MemorySink } from "../cli/run/io.ts";
import { decodeOutcome, exitStatus } from "../cli/run/outcome.ts";
import { buildToolProgram } from "../cli/run/program.ts";
import { describePacking, formatBytes, formatElapsed, Progress } from "../cli/run/progress.ts";
import { RemoteFailure, replayResult } from "../cli/run/replay.ts";
import { describeWait, parseLoad, watchWaiting } from "../cli/run/watch.ts";
import { startServer, type TestServer } from "./_server.ts";

const CLI = new URL("../cli.ts", import.meta.url).pathname;
const decoder = new TextDecoder();

function assertEquals(actual: unknown, expected: unknown, message?: string): void {
  assert.deepStrictEqual(actual, expected, message);
}

// ---------------------------------------------------------------------------------------
// Process helpers

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

interface RunOptions {
  env?: Record<string, string>;
  cwd?: string;
  stdin?: string;
}

/** `deno run -A cli.ts ARGS...` with KCORAL_URL unset unless `env` sets it. */
async function kcoralRaw(args: string[], options: RunOptions = {}): Promise<Run> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    cwd: options.cwd,
    env: { KCORAL_URL: "", NO_COLOR: "1", ...options.env },
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (options.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(options.stdin));
    await writer.close();
  }
  const output = await child.output();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}

/** `kcoral run ARGS...`. */
function kcoral(args: string[], options: RunOptions = {}): Promise<Run> {
  return kcoralRaw(["run", ...args], options);
}

function show(run: Run): string {
  return `exit ${run.code}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
}

function expectRun(run: Run, code: number, stdout?: string, stderr?: string | RegExp): void {
  assertEquals(run.code, code, show(run));
  if (stdout !== undefined) assertEquals(run.stdout, stdout, show(run));
  if (typeof stderr === "string") assertEquals(run.stderr, stderr, show(run));
  else if (stderr !== undefined) assert.match(run.stderr, stderr, show(run));
}

/** Create files (`content` or `[content, mode]`) under `root`. */
async function writeTree(
  root: string,
  files: Record<string, string | Uint8Array | [string, number]>,
): Promise<void> {
  for (const [name, spec] of Object.entries(files)) {
    const path = `${root}/${name}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    const [content, mode] = Array.isArray(spec) ? spec : [spec, 0o644];
    if (typeof content === "string") await Deno.writeTextFile(path, content);
    else await Deno.writeFile(path, content);
    await Deno.chmod(path, mode);
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/** A TCP listener that counts and drops every connection. */
function countingListener(): { url: string; port: number; count: () => number; close(): void } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let accepted = 0;
  (async () => {
    try {
      for await (const connection of listener) {
        accepted++;
        connection.close();
      }
    } catch {
      // closed
    }
  })();
  const port = listener.addr.port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    count: () => accepted,
    close: () => listener.close(),
  };
}

// A remote listing of the working directory: `path/` for directories, `path*` for
// executable files.
const LIST_FILES = [
  "import os",
  "entries = []",
  "for root, dirs, files in os.walk('.'):",
  "    entries += [os.path.relpath(os.path.join(root, d)) + '/' for d in dirs]",
  "    for f in files:",
  "        p = os.path.relpath(os.path.join(root, f))",
  "        entries.append(p + ('*' if os.access(p, os.X_OK) else ''))",
  "print('\\n'.join(sorted(entries)))",
].join("\n");

// One fake for the three native tools, dispatched on its own name. It prints its argv
// and environment facts as JSON, writes what the real tool would, and exits with
// $FAKE_EXIT (default 3). FAKE_NO_OUTPUT=1 makes it write nothing.
const FAKE_TOOL = `#!/usr/bin/env python3
import json, os, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
print(json.dumps({
    "tool": tool,
    "argv": args,
    "ncu_profile": os.environ.get("NCU_PROFILE"),
    "cwd_is_kcoral_dir": os.getcwd() == os.environ["KCORAL_DIR"],
}))
if os.environ.get("FAKE_NO_OUTPUT") != "1":
    if tool == "ncu":
        with open(args[args.index("--export") + 1], "xb") as report:
            report.write(b"NCU\\x00\\xff fake report")
    elif tool == "run-iket":
        out = args[args.index("--output-dir") + 1]
        os.mkdir(out)  # fails if the runner created it: IKET wants a new directory
        os.mkdir(os.path.join(out, "intermediate"))
        with open(os.path.join(out, "trace.json"), "w") as trace:
            trace.write('{"traceEvents": []}')
        with open(os.path.join(out, "intermediate", "raw.bin"), "wb") as raw:
            raw.write(bytes(range(256)))
    elif tool == "compute-sanitizer" and "--log-file" in args:
        with open(args[args.index("--log-file") + 1], "w") as log:
            log.write("========= ERROR SUMMARY: 0 errors\\n")
sys.exit(int(os.environ.get("FAKE_EXIT", "3")))
`;

// ---------------------------------------------------------------------------------------
// Unit tests: program, outcome, exit status, replay, progress

Deno.test("the program is exactly upstream's (cli.md §2.2)", async () => {
  const archive = new TextEncoder().encode("tar bytes");
  const digest = await crypto.subtle.digest("SHA-256", archive);
  const hash = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  const sources = { runner: "def run(*a):\n    pass\n", definition: "def run(*b):\n    pass\n" };
  const args = {
    forwarded: ["check.py", "--url", "literal"],
    env: { MODE: "debug", EMPTY: "" },
    fetch: ["results"],
    timeoutSeconds: 12,
    outputLimitBytes: 345,
  };
  const withOut = buildToolProgram(sources, archive, { ...args, out: "artifacts" });
  const expected = {
    instructions: [
      { op: "upload", kind: "module", source: sources.runner, id: "tool_runner" },
      { op: "get_function", id: "runner", module: { $ref: "tool_runner" }, name: "run" },
      { op: "upload", kind: "module", source: sources.definition, id: "definition" },
      { op: "get_function", id: "tool_run", module: { $ref: "definition" }, name: "run" },
      { op: "upload", kind: "bytes", blob: hash, id: "inputs" },
      {
        op: "run",
        id: "run",
        fn: { $ref: "runner" },
        args: [
          { $ref: "inputs" },
          { $ref: "tool_run" },
          ["check.py", "--url", "literal"],
          { MODE: "debug", EMPTY: "" },
          ["results"],
        ],
      },
      { op: "return", key: "outcome", value: { $ref: "run" } },
      { op: "return", key: "artifacts", kind: "folder", path: "outputs" },
    ],
    options: { timeout_seconds: 12, output_limit_bytes: 345 },
  };
  assertEquals(JSON.parse(withOut.program.toJson(withOut.options)), expected);
  assertEquals([...withOut.program.blobs.keys()], [hash]);
  const withoutOut = buildToolProgram(sources, archive, args);
  assertEquals(JSON.parse(withoutOut.program.toJson(withoutOut.options)), {
    ...expected,
    instructions: expected.instructions.slice(0, -1),
  });
});

Deno.test("exit status: code kept, 128+N for signals, missing output turns 0 into 1", () => {
  const cases: [number, string[], number][] = [
    [0, [], 0],
    [7, [], 7],
    [255, [], 255],
    [-15, [], 143],
    [-9, [], 137],
    [-2, ["x"], 130],
    [0, ["results"], 1],
    [9, ["results", "log"], 9],
  ];
  for (const [returncode, missing, status] of cases) {
    assertEquals(exitStatus({ returncode, missing }), status, `${returncode} ${missing}`);
  }
  assertEquals(
    decodeOutcome(new Map<string, never>([["returncode", 3 as never], ["missing", [] as never]])),
    { returncode: 3, missing: [] },
  );
  for (
    const bad of [undefined, 3, new Map([["missing", []]]), new Map([["returncode", "0"]])]
  ) {
    assert.throws(() => decodeOutcome(bad as never), { name: "ProtocolError" });
  }
});

function result(fields: Partial<ConstructorParameters<typeof ProgramResult>[0]>): ProgramResult {
  return new ProgramResult({
    status: "COMPLETED",
    requestId: "r",
    queueMs: 0,
    elapsedMs: 1,
    leaseWaitMs: 0,
    leaseHeldMs: 1,
    results: new Map(),
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    error: null,
    gpuIds: [],
    ...fields,
  });
}

Deno.test("replay: FAILED replays output first, then fails with status, message, traceback", async () => {
  const stdout = new MemorySink();
  const stderr = new MemorySink();
  const failed = result({
    status: "FAILED",
    stdout: "partial\n",
    stderr: "remote\n",
    stderrTruncated: true,
    error: {
      kind: "runtime",
      message: "RuntimeError: boom",
      instructionIndex: 5,
      instructionOp: "run",
      instructionId: "run",
      traceback: "Traceback (most recent call last):\nRuntimeError: boom\n",
    },
  });
  await assert.rejects(replayResult(failed, { stdout, stderr }), (error: unknown) => {
    assert.ok(error instanceof RemoteFailure);
    assertEquals(
      describeError(error),
      "FAILED: RuntimeError: boom\nTraceback (most recent call last):\nRuntimeError: boom",
    );
    return true;
  });
  assertEquals(stdout.text(), "partial\n");
  assertEquals(stderr.text(), "remote\nkcoral: remote output was truncated\n");
  assertEquals(describeError(new TransportError("down")), "TransportError: down");
  assertEquals(describeError(new Deno.errors.NotFound("gone")), "gone");
});

Deno.test("progress: nothing at all when stderr is not a terminal", async () => {
  let written = "";
  const progress = new Progress({ write: (text) => written += text, isTerminal: false });
  progress.update("kcoral: running, 1 s", { force: true });
  progress.clear();
  const watch = watchWaiting({ progress, health: () => Promise.resolve({}), intervalMs: 1 });
  await watch.stop();
  assertEquals(written, "");
  assertEquals(progress.enabled, false);
});

Deno.test("progress: one line rewritten with \\r, throttled, delayed, cut, cleared", () => {
  let written = "";
  let clock = 1000;
  const progress = new Progress({
    write: (text) => written += text,
    isTerminal: true,
    columns: 12,
    now: () => clock,
    intervalMs: 100,
    delayMs: 300,
  });
  progress.clear(); // nothing shown: nothing erased
  progress.update("early", { force: true }); // within the delay
  assertEquals(written, "");
  clock = 1300;
  progress.update("kcoral: packing inputs");
  assertEquals(written, "\rkcoral: pac\x1b[K");
  clock = 1350;
  progress.update("second"); // throttled
  progress.update("kcoral: packing inputs", { force: true }); // identical: not rewritten
  assertEquals(written, "\rkcoral: pac\x1b[K");
  progress.update("forced", { force: true });
  clock = 1500;
  progress.update("lazy");
  progress.clear();
  progress.clear();
  assertEquals(written, "\rkcoral: pac\x1b[K\rforced\x1b[K\rlazy\x1b[K\r\x1b[K");
});

Deno.test("progress texts: sizes, elapsed time, queued vs running", () => {
  assertEquals(formatBytes(0), "0 B");
  assertEquals(formatBytes(1023), "1023 B");
  assertEquals(formatBytes(1536), "1.5 KiB");
  assertEquals(formatBytes(5 * 1024 ** 3), "5.0 GiB");
  assertEquals(formatElapsed(999), "0 s");
  assertEquals(formatElapsed(59_999), "59 s");
  assertEquals(formatElapsed(3_605_000), "60 min 05 s");
  assertEquals(describePacking(2, 2048), "kcoral: packing inputs: 2 files, 2.0 KiB");
  const load = (inProgress: number, waiting: number) =>
    parseLoad({
      status: "ok",
      load: { request_capacity: 1, requests_in_progress: inProgress, requests_waiting: waiting },
    });
  assertEquals(describeWait(1500, null), "kcoral: waiting for the server, 1 s");
  assertEquals(describeWait(2000, load(1, 0)), "kcoral: running, 2 s");
  assertEquals(describeWait(2000, load(1, 1)), "kcoral: queued, 2 s (1 request waiting)");
  assertEquals(describeWait(0, load(0, 0)), "kcoral: sending request, 0 s");
  assertEquals(parseLoad({ status: "ok", load: { request_capacity: 1 } }), null);
  assertEquals(parseLoad("ok"), null);
});

Deno.test("progress: after end() (the remote output has begun) nothing is drawn again", async () => {
  let written = "";
  const progress = new Progress({ write: (text) => written += text, isTerminal: true });
  const watch = watchWaiting({ progress, health: () => Promise.resolve({}), intervalMs: 1 });
  progress.end();
  const ended = written;
  assert.ok(ended.endsWith("\r\x1b[K"), JSON.stringify(ended));
  await new Promise((resolve) => setTimeout(resolve, 20)); // the watcher keeps rendering
  await watch.stop();
  progress.update("kcoral: hashing inputs", { force: true });
  assertEquals(written, ended);
});

Deno.test("progress while waiting: polls the load, shows running/queued, stops cleanly", async () => {
  const lines: string[] = [];
  const progress = new Progress({ write: (text) => lines.push(text), isTerminal: true });
  const loads = [
    { request_capacity: 1, requests_in_progress: 1, requests_waiting: 2 },
    { request_capacity: 1, requests_in_progress: 1, requests_waiting: 0 },
  ];
  let polls = 0;
  const watch = watchWaiting({
    progress,
    health: () => Promise.resolve({ status: "ok", load: loads[Math.min(polls++, 1)] }),
    intervalMs: 5,
  });
  while (polls < 4) await new Promise((resolve) => setTimeout(resolve, 5));
  await watch.stop();
  const after = lines.length;
  await new Promise((resolve) => setTimeout(resolve, 20));
  assertEquals(lines.length, after, "nothing is written after stop()");
  assertEquals(lines[0], "\rkcoral: waiting for the server, 0 s\x1b[K");
  assert.ok(lines.includes("\rkcoral: queued, 0 s (2 requests waiting)\x1b[K"), String(lines));
  assert.ok(lines.includes("\rkcoral: running, 0 s\x1b[K"), String(lines));

  // A server without load counters: polling stops after three failures.
  let failing = 0;
  const quiet = watchWaiting({
    progress,
    health: () => (failing++, Promise.reject(new Error("404"))),
    intervalMs: 2,
  });
  const deadline = Date.now() + 5000;
  while (failing < 3 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  await new Promise((resolve) => setTimeout(resolve, 30));
  await quiet.stop();
  assertEquals(failing, 3);
});

// ---------------------------------------------------------------------------------------
// Processes without a server

Deno.test("help works with no server; argument errors exit 2 and contact nothing", async () => {
  const listener = countingListener();
  try {
    const env = { KCORAL_URL: listener.url };
    const [root, runHelp, pythonHelp, ncuHelp, shellHelp] = await Promise.all([
      kcoralRaw(["--help"], { env }),
      kcoral(["--help"], { env }),
      kcoral(["python", "--help"], { env }),
      kcoral(["ncu", "-h", "--", "x"], { env }),
      kcoral(["shell", "--send", "x", "--help"]),
    ]);
    expectRun(root, 0, undefined, "");
    assert.match(root.stdout, /^usage: kcoral .*\{server,router,run,health,mcp,eval\}/);
    expectRun(runHelp, 0, undefined, "");
    assert.match(runHelp.stdout, /^usage: kcoral run /);
    for (const tool of ["python", "compute-sanitizer", "ncu", "run-iket", "shell"]) {
      assert.ok(runHelp.stdout.includes(tool), tool);
    }
    for (const [help, tool] of [[pythonHelp, "python"], [ncuHelp, "ncu"], [shellHelp, "shell"]]) {
      const run = help as Run;
      expectRun(run, 0, undefined, "");
      assert.ok(run.stdout.startsWith(`usage: kcoral run ${tool} `), run.stdout);
      assert.ok(run.stdout.includes("--output-limit-bytes"));
      assert.ok(run.stdout.includes("--send") && run.stdout.includes("--out"));
    }

    // Each: arguments, expected message; all exit 2 without contacting anything.
    const cases: [string[], string][] = [
      [[], "kcoral run: error: the following arguments are required: tool"],
      [["bogus", "--", "x"], "kcoral run: error: argument tool: invalid choice: 'bogus'"],
      [["python", "--send", "x"], "separate KCoral options from tool arguments with '--'"],
      [["python", "--"], "arguments are required after '--'"],
      [["python", "--", "-i", "check.py"], "interactive Python execution is unsupported"],
      [["python", "--", "-"], "stdin execution is unsupported"],
      [["python", "--", "-c"], "Python -c requires an argument"],
      [["python", "--timeout", "0", "--", "-c", "pass"], "--timeout must be positive"],
      [["python", "--timeout", "1.5", "--", "x"], "argument --timeout: invalid int value"],
      [
        ["python", "--output-limit-bytes", "0", "--", "-c", "pass"],
        "--output-limit-bytes must be positive",
      ],
      [
        ["python", "-e", "CUDA_VISIBLE_DEVICES=0", "--", "-c", "pass"],
        "CUDA_VISIBLE_DEVICES is managed by the remote worker",
      ],
      [
        ["python", "-e", "KCORAL_DIR=/tmp", "--", "x"],
        "KCORAL_DIR is managed by the remote worker",
      ],
      [
        ["python", "-e", "KCORAL_TEST_UNSET_LOCAL", "--", "x"],
        "local environment variable KCORAL_TEST_UNSET_LOCAL is not set",
      ],
      [["python", "-e", "BAD-NAME=x", "--", "x"], "environment variable names must be identifiers"],
      [["python", "--fetch", "x", "--", "x"], "--fetch and --out must be used together"],
      [["python", "--fetch", "../x", "--out", "o", "--", "x"], "expected a relative file path"],
      [["shell", "--url", listener.url, "--port", "1", "--", "true"], "--url cannot be combined"],
      [["shell", "--port", "0", "--", "true"], "--port must be between 1 and 65535"],
      [["shell", "--host", "http://gpu", "--", "true"], "--host must be a hostname or IP address"],
      [["ncu", "--", "--", "python", "c.py"], "the following arguments are required: --out"],
      [
        ["ncu", "--out", "r", "--", "--export=custom", "--", "python", "c.py"],
        "--export conflicts with managed remote capture paths or mode",
      ],
      [
        ["ncu", "--out", "r", "--", "-ifile", "--", "python", "c.py"],
        "-ifile conflicts with managed remote capture paths or mode",
      ],
      [["ncu", "--fetch", "x", "--out", "r", "--", "--", "a"], "unrecognized arguments: --fetch"],
      [["ncu", "--out", "r", "--", "--set", "basic"], "with another '--'"],
      [["run-iket", "--out", "r", "--", "profile"], "with another '--'"],
      [["run-iket", "--out", "r", "--", "--", "python", "c.py"], "expected profiler options"],
      [
        ["run-iket", "--out", "r", "--", "--output-dir=x", "profile", "--", "python", "c.py"],
        "--output-dir conflicts with",
      ],
      [["shell", "--", "true"], "set KCORAL_URL or pass --url, --host or --port"],
    ];
    const runs = await Promise.all(
      cases.map(([args]) => kcoral(args, { env: args[0] === "shell" ? {} : env })),
    );
    cases.forEach(([args, message], index) => {
      const run = runs[index];
      expectRun(run, 2, "", /^usage: kcoral run/);
      assert.ok(run.stderr.includes(message), `${args.join(" ")}\n${show(run)}`);
    });

    // The host/port override warning is printed before a later argument error.
    const warned = await kcoral(
      ["python", "--port", String(listener.port), "--timeout", "0", "--", "x"],
      { env: { KCORAL_URL: "http://environment.invalid" } },
    );
    expectRun(warned, 2, "");
    assert.ok(
      warned.stderr.startsWith(
        `kcoral: warning: --host/--port override KCORAL_URL; using ${listener.url}\nusage: `,
      ),
      show(warned),
    );

    // Local errors found before sending: exit 1, nothing contacted either.
    const temp = await Deno.makeTempDir({ prefix: "kcoral-cli-local-" });
    try {
      await writeTree(temp, { "existing/file.txt": "x", "plain.txt": "x", "dir/a.txt": "a" });
      await Deno.symlink(`${temp}/nowhere`, `${temp}/dangling`);
      await Deno.symlink(`${temp}/plain.txt`, `${temp}/dir/link`);
      const local: [string[], string][] = [
        [
          ["--out", "existing", "--fetch", "x"],
          "output already exists; choose a new --out directory: existing",
        ],
        [
          ["--out", `${temp}/plain.txt`, "--fetch", "x"],
          `output already exists; choose a new --out directory: ${temp}/plain.txt`,
        ],
        [
          ["--out", "dangling", "--fetch", "x"],
          "output already exists; choose a new --out directory: dangling",
        ],
        [["--send", "missing.txt"], "input must exist and not be a symlink: missing.txt"],
        [["--send", "dir"], "symlink inputs are not supported: dir/link"],
        [
          ["--send", "plain.txt", "--send", "plain.txt"],
          "duplicate or conflicting input path: plain.txt",
        ],
      ];
      const localRuns = await Promise.all(
        local.map(([args]) => kcoral(["python", ...args, "--", "-c", "pass"], { env, cwd: temp })),
      );
      local.forEach(([_args, message], index) => {
        expectRun(localRuns[index], 1, "", `kcoral run python: ${message}\n`);
      });
      assertEquals(await Deno.readTextFile(`${temp}/existing/file.txt`), "x");
    } finally {
      await Deno.remove(temp, { recursive: true });
    }
    assertEquals(listener.count(), 0, "no connection before a request is due");

    // Control: a valid command does connect to the listener (which drops it): exit 1.
    const control = await kcoral(["python", "--", "-c", "pass"], { env });
    expectRun(control, 1, "", /^kcoral run python: TransportError: /);
    assert.ok(listener.count() > 0, "the listener counts connections");
  } finally {
    listener.close();
  }
});

Deno.test("transport, HTTP and protocol errors exit 1 with a typed diagnostic", async () => {
  const free = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = free.addr.port;
  free.close();
  const fake = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (request) => {
    if (new URL(request.url).pathname === "/busy/execute") {
      return Response.json(
        { error: { kind: "busy", message: "server saturated" }, request_id: "r1" },
        { status: 503 },
      );
    }
    return new Response("not json", { headers: { "content-type": "application/json" } });
  });
  try {
    const base = `http://127.0.0.1:${fake.addr.port}`;
    const [refused, busy, garbage, badUrl] = await Promise.all([
      kcoral(["python", "--port", String(port), "--", "-c", "pass"]),
      kcoral(["shell", "--url", `${base}/busy`, "--", "true"]),
      kcoral(["shell", "--url", base, "--", "true"]),
      kcoral(["shell", "--url", "not a url", "--", "true"]),
    ]);
    expectRun(
      refused,
      1,
      "",
      new RegExp(`^kcoral run python: TransportError: cannot connect to 127\\.0\\.0\\.1:${port}: `),
    );
    expectRun(busy, 1, "", "kcoral run shell: KCoralError: HTTP 503: server saturated\n");
    expectRun(garbage, 1, "", /^kcoral run shell: ProtocolError: /);
    // A malformed URL is a usage error (exit 2), said before anything is contacted.
    expectRun(
      badUrl,
      2,
      "",
      /kcoral run shell: error: argument --url: not an http:\/\/ or https:\/\/ URL: 'not a url'\n$/,
    );
  } finally {
    await fake.shutdown();
  }
});

// ---------------------------------------------------------------------------------------
// Against a live server

Deno.test("kcoral run against a live local server", async (t) => {
  const server: TestServer = await startServer({ maxRequestsPerWorker: 0, numWorkers: 2 });
  const temp = await Deno.makeTempDir({ prefix: "kcoral-cli-run-" });
  let stopped = false;
  const env = { KCORAL_URL: server.url };
  const run = (args: string[], options: RunOptions = {}) =>
    kcoral(args, { cwd: temp, ...options, env: { ...env, ...options.env } });
  try {
    await writeTree(temp, {
      "experiment/check.py": [
        "import os, sys",
        "assert os.environ['KCORAL_DIR'] == os.getcwd()",
        "value = open('experiment/value.txt').read().strip()",
        "print(value, os.environ.get('MODE'), sys.argv[1:])",
        "print('remote stderr', file=sys.stderr)",
        "sys.exit(7)",
        "",
      ].join("\n"),
      "experiment/value.txt": "uploaded\n",
      "experiment/data/input.json": '{"n": 3}\n',
      "experiment/show.py": "import json, sys\nprint(json.load(open(sys.argv[1]))['n'])\n",
      "experiment/.hidden": "h",
      "experiment/__pycache__/check.cpython-311.pyc": "compiled",
      "experiment/run.sh": [
        "#!/bin/sh\nprintf 'run.sh ran:'\nprintf ' [%s]' \"$@\"\necho\n",
        0o755,
      ],
      "experiment/setup.sh": [
        "#!/bin/sh\nmkdir -p result/empty\nprintf '\\000\\377' > result/data.bin\nexit 9\n",
        0o755,
      ],
      "fakes/ncu": [FAKE_TOOL, 0o755],
      "fakes/compute-sanitizer": [FAKE_TOOL, 0o755],
      "fakes/run-iket": [FAKE_TOOL, 0o755],
    });
    await Deno.mkdir(`${temp}/experiment/empty`);
    const fakePath = `PATH=${temp}/fakes:/usr/bin:/bin`;

    await t.step("python: sys.exit(7) keeps the code; stdout and stderr exact", async () => {
      const result = await run([
        "python",
        "--send",
        "experiment",
        "-e",
        "MODE=debug",
        "--",
        "experiment/check.py",
        "--url",
        "literal",
      ]);
      expectRun(result, 7, "uploaded debug ['--url', 'literal']\n", "remote stderr\n");
    });

    await t.step("exit codes: 0, signal 143, python exception, missing executable", async () => {
      const [ok, sigterm, sigkill, exception, notInstalled, notExecutable] = await Promise.all([
        run(["python", "--", "-c", "print('hello from the worker')"]),
        run(["python", "--", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]),
        run(["shell", "--", "sh", "-c", "kill -KILL $$"]),
        run(["python", "--", "-c", "raise RuntimeError('bad kernel')"]),
        run(["shell", "--", "no-such-kcoral-executable", "arg"]),
        run(["shell", "--send", "experiment/value.txt", "--", "./value.txt"]),
      ]);
      expectRun(ok, 0, "hello from the worker\n", "");
      expectRun(sigterm, 143, "", "");
      expectRun(sigkill, 137, "", "");
      expectRun(exception, 1, "", /RuntimeError: bad kernel\n$/);
      assert.match(exception.stderr, /^Traceback \(most recent call last\):/);
      const pairs = [[notInstalled, "no-such-kcoral-executable"], [notExecutable, "./value.txt"]];
      for (const [result, name] of pairs as [Run, string][]) {
        const message = `kcoral run shell: FAILED: RuntimeError: ${name} is not installed in ` +
          "the remote server environment\nTraceback (most recent call last):\n";
        expectRun(result, 1, "");
        assert.ok(result.stderr.startsWith(message), show(result));
      }
    });

    await t.step(
      "--fetch: a missing path exits 1; a missing path keeps a nonzero code",
      async () => {
        const [missing, keeps] = await Promise.all([
          run(["python", "--fetch", "missing", "--out", "out-missing", "--", "-c", "pass"]),
          run(["python", "--fetch", "missing", "--out", "out-keeps", "--", "-c", "exit(5)"]),
        ]);
        expectRun(
          missing,
          1,
          "",
          "kcoral: saved artifacts to out-missing\nkcoral: missing artifacts: missing\n",
        );
        expectRun(keeps, 5, "", /kcoral: missing artifacts: missing\n$/);
        assertEquals([...Deno.readDirSync(`${temp}/out-missing`)], []);
      },
    );

    await t.step("--fetch of a binary file and an empty directory after exit 9", async () => {
      const out = `${temp}/nested/parents/artifacts`;
      const result = await run([
        "shell",
        "--send",
        "experiment",
        "--fetch",
        "result",
        "--out",
        out,
        "--",
        "./experiment/setup.sh",
      ]);
      expectRun(result, 9, "", `kcoral: saved artifacts to ${out}\n`);
      assertEquals(await Deno.readFile(`${out}/result/data.bin`), new Uint8Array([0, 255]));
      assert.ok((await Deno.stat(`${out}/result/empty`)).isDirectory);
      assertEquals([...Deno.readDirSync(`${out}/result/empty`)], []);
      assertEquals([...Deno.readDirSync(out)].map((entry) => entry.name), ["result"]);
    });

    await t.step("a symlinked fetch target is refused and nothing is saved", async () => {
      const result = await run([
        "shell",
        "--fetch",
        "link",
        "--out",
        "parent/out-link",
        "--",
        "sh",
        "-c",
        "ln -s /etc/passwd link",
      ]);
      expectRun(result, 1, "", /^kcoral run shell: FAILED: ValueError: artifact is a symlink: /);
      assert.ok(result.stderr.includes("symlink"));
      assert.ok(await exists(`${temp}/parent`), "the parent of --out is created beforehand");
      assert.ok(!(await exists(`${temp}/parent/out-link`)), "--out is not created");
    });

    await t.step("--out collision: exit 1 and the server never sees a request", async () => {
      await Deno.mkdir(`${temp}/taken`);
      const before = server.events.filter((e) => e.event === "request_received").length;
      const result = await run(["python", "--fetch", "x", "--out", "taken", "--", "-c", "pass"]);
      expectRun(
        result,
        1,
        "",
        "kcoral run python: output already exists; choose a new --out directory: taken\n",
      );
      const control = await run(["python", "--", "-c", "pass"]);
      expectRun(control, 0, "", "");
      const after = server.events.filter((e) => e.event === "request_received").length;
      assertEquals(after, before + 1, "only the control request reached the server");
    });

    await t.step("environment: copies, assignments, managed names, PATH order", async () => {
      const show = [
        "import os, sys",
        "print(os.environ['MODE'], repr(os.environ['EMPTY']), os.environ['LOCAL_VALUE'])",
        "print(os.environ['KCORAL_DIR'] == os.getcwd(), os.path.basename(os.getcwd()))",
        "path = os.environ['PATH'].split(os.pathsep)",
        "print(path[0] == os.path.dirname(sys.executable), path[1:])",
        "print('CUDA_VISIBLE_DEVICES' in os.environ, repr(sys.stdin.read()))",
      ].join("\n");
      const result = await run([
        "python",
        "-e",
        "MODE=first",
        "--env",
        "MODE=debug",
        "-e",
        "EMPTY=",
        "-e",
        "LOCAL_VALUE",
        "-e",
        "PATH=/custom/bin:/usr/bin",
        "--",
        "-c",
        show,
      ], { env: { LOCAL_VALUE: "copied value", MODE: "local-not-sent" }, stdin: "local stdin" });
      expectRun(
        result,
        0,
        "debug '' copied value\nTrue inputs\nTrue ['/custom/bin', '/usr/bin']\nFalse ''\n",
        "",
      );
      const unset = await run(["python", "-e", "MODE", "--", "-c", "pass"], { env: { MODE: "" } });
      expectRun(unset, 0, "", "");
      const missing = await kcoral(["python", "-e", "KCORAL_NOT_SET_ANYWHERE", "--", "x"], {
        env,
      });
      expectRun(missing, 2, "", /local environment variable KCORAL_NOT_SET_ANYWHERE is not set/);
    });

    await t.step(
      "--send layout: file basename, directory name, '.', absolute, data paths",
      async () => {
        const listing = (args: string[], cwd = temp) =>
          run(["python", ...args, "--", "-c", LIST_FILES], { cwd });
        const directory = [
          "experiment/",
          "experiment/.hidden",
          "experiment/check.py",
          "experiment/data/",
          "experiment/data/input.json",
          "experiment/run.sh*",
          "experiment/setup.sh*",
          "experiment/show.py",
          "experiment/value.txt",
        ].join("\n") + "\n";
        const [file, relative, trailing, absolute, dot, both, none] = await Promise.all([
          listing(["--send", "experiment/check.py"]),
          listing(["--send", "experiment"]),
          listing(["--send", "experiment/"]),
          listing(["--send", `${temp}/experiment`], "/"),
          listing(["--send", "."], `${temp}/experiment`),
          listing(["--send", "experiment", "--send", "experiment/run.sh"]),
          listing([]),
        ]);
        expectRun(file, 0, "check.py\n", "");
        for (const result of [relative, trailing, absolute, dot]) {
          expectRun(result, 0, directory, "");
        }
        expectRun(both, 0, `${directory}run.sh*\n`, "");
        expectRun(none, 0, "\n", "");
        const [data, script] = await Promise.all([
          run([
            "python",
            "--send",
            "experiment",
            "--",
            "experiment/show.py",
            "experiment/data/input.json",
          ]),
          run(["shell", "--send", "experiment", "--", "./experiment/run.sh", "a b", "c"]),
        ]);
        expectRun(data, 0, "3\n", "");
        expectRun(script, 0, "run.sh ran: [a b] [c]\n", "");
      },
    );

    await t.step(
      "output: UTF-8 with replacement, truncation warning, stdout untouched",
      async () => {
        const [invalid, truncated, both] = await Promise.all([
          run([
            "python",
            "--",
            "-c",
            "import sys; sys.stdout.buffer.write(b'a\\xffb\\n'); sys.stderr.buffer.write(b'\\xfe\\n')",
          ]),
          run(["python", "--output-limit-bytes", "8", "--", "-c", "print('x' * 100)"]),
          run([
            "python",
            "--output-limit-bytes",
            "8",
            "--",
            "-c",
            "import sys; print('12345678901'); print('e' * 20, file=sys.stderr); sys.exit(4)",
          ]),
        ]);
        expectRun(invalid, 0, "a\ufffdb\n", "\ufffd\n");
        expectRun(truncated, 0, "xxxxxxxx", "kcoral: remote output was truncated\n");
        expectRun(both, 4, "12345678", "eeeeeeeekcoral: remote output was truncated\n");
      },
    );

    await t.step("host/port override KCORAL_URL with a warning, then run", async () => {
      const port = new URL(server.url).port;
      const result = await run(
        ["shell", "--host", "127.0.0.1", "--port", port, "--", "echo", "hi"],
        {
          env: { KCORAL_URL: "http://environment.invalid:1" },
        },
      );
      expectRun(
        result,
        0,
        "hi\n",
        `kcoral: warning: --host/--port override KCORAL_URL; using http://127.0.0.1:${port}\n`,
      );
    });

    await t.step(
      "ncu (fake): managed argv, NCU_PROFILE, report returned after failure",
      async () => {
        const args = (out: string, extra: string[] = []) => [
          "ncu",
          "--send",
          "experiment",
          "--out",
          out,
          "-e",
          fakePath,
          ...extra,
          "--",
          "--set",
          "basic",
          "--launch-count",
          "1",
          "--",
          "python",
          "experiment/check.py",
          "a b",
        ];
        const [report, override, noReport, noReportFailed] = await Promise.all([
          run(args("ncu-out")),
          run(args("ncu-override", ["-e", "NCU_PROFILE=0"])),
          run(args("ncu-none", ["-e", "FAKE_NO_OUTPUT=1", "-e", "FAKE_EXIT=0"])),
          run(args("ncu-none-failed", ["-e", "FAKE_NO_OUTPUT=1"])),
        ]);
        expectRun(report, 3, undefined, "kcoral: saved artifacts to ncu-out\n");
        const recorded = JSON.parse(report.stdout);
        assertEquals(recorded.tool, "ncu");
        assertEquals(recorded.argv.slice(0, 3), ["--config-file", "0", "--export"]);
        assert.match(recorded.argv[3], /^\/.*\/outputs\/capture\.ncu-rep$/);
        assertEquals(recorded.argv.slice(4), [
          "--set",
          "basic",
          "--launch-count",
          "1",
          "python",
          "experiment/check.py",
          "a b",
        ]);
        assertEquals(recorded.ncu_profile, "1");
        assertEquals(recorded.cwd_is_kcoral_dir, true);
        const encode = (text: string) => new TextEncoder().encode(text);
        assertEquals(
          await Deno.readFile(`${temp}/ncu-out/capture.ncu-rep`),
          new Uint8Array([...encode("NCU"), 0, 255, ...encode(" fake report")]),
        );
        assertEquals(
          [...Deno.readDirSync(`${temp}/ncu-out`)].map((e) => e.name),
          ["capture.ncu-rep"],
        );
        expectRun(override, 3);
        assertEquals(JSON.parse(override.stdout).ncu_profile, "0");
        expectRun(
          noReport,
          1,
          undefined,
          "kcoral: saved artifacts to ncu-none\nkcoral: missing artifacts: capture.ncu-rep\n",
        );
        expectRun(noReportFailed, 3, undefined, /kcoral: missing artifacts: capture\.ncu-rep\n$/);
      },
    );

    await t.step("run-iket (stand-in): --output-dir first, all files returned", async () => {
      const args = (out: string, extra: string[] = []) => [
        "run-iket",
        "--out",
        out,
        "-e",
        fakePath,
        ...extra,
        "--",
        "profile",
        "--postprocess",
        "json",
        "--",
        "python",
        "check.py",
        "a b",
      ];
      const [traced, empty] = await Promise.all([
        run(args("iket-out")),
        run(args("iket-none", ["-e", "FAKE_NO_OUTPUT=1", "-e", "FAKE_EXIT=0"])),
      ]);
      expectRun(traced, 3, undefined, "kcoral: saved artifacts to iket-out\n");
      const recorded = JSON.parse(traced.stdout);
      assertEquals(recorded.tool, "run-iket");
      assertEquals(recorded.argv[0], "--output-dir");
      assert.match(recorded.argv[1], /^\/.*\/outputs$/);
      assertEquals(recorded.argv.slice(2), [
        "profile",
        "--postprocess",
        "json",
        "--",
        "python",
        "check.py",
        "a b",
      ]);
      assertEquals(
        await Deno.readTextFile(`${temp}/iket-out/trace.json`),
        '{"traceEvents": []}',
      );
      assertEquals(
        await Deno.readFile(`${temp}/iket-out/intermediate/raw.bin`),
        Uint8Array.from({ length: 256 }, (_, i) => i),
      );
      expectRun(empty, 1, undefined, /kcoral: missing artifacts: run-iket output\n$/);
    });

    await t.step("compute-sanitizer (fake): options forwarded, --log-file fetched", async () => {
      const result = await run([
        "compute-sanitizer",
        "-e",
        fakePath,
        "--fetch",
        "sanitizer.log",
        "--out",
        "sanitizer-out",
        "--",
        "--tool",
        "racecheck",
        "--error-exitcode",
        "1",
        "--log-file",
        "sanitizer.log",
        "python",
        "check.py",
        "a b",
      ]);
      expectRun(result, 3, undefined, "kcoral: saved artifacts to sanitizer-out\n");
      const recorded = JSON.parse(result.stdout);
      assertEquals(recorded.tool, "compute-sanitizer");
      assertEquals(recorded.argv, [
        "--tool",
        "racecheck",
        "--error-exitcode",
        "1",
        "--log-file",
        "sanitizer.log",
        "python",
        "check.py",
        "a b",
      ]);
      assertEquals(recorded.ncu_profile, null);
      assertEquals(
        await Deno.readTextFile(`${temp}/sanitizer-out/sanitizer.log`),
        "========= ERROR SUMMARY: 0 errors\n",
      );
    });

    await t.step("a hard timeout exits 1 with the server's error", async () => {
      const result = await run([
        "python",
        "--timeout",
        "1",
        "--",
        "-c",
        "import time; time.sleep(30)",
      ]);
      expectRun(result, 1, "", "kcoral run python: KCoralError: HTTP 504: execution timed out\n");
    });

    await t.step("progress on a terminal: one line, rewritten, erased before output", async () => {
      const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;
      const command = [
        Deno.execPath(),
        "run",
        "-A",
        CLI,
        "run",
        "python",
        "--url",
        server.url,
        "--",
        "-c",
        "import time; time.sleep(1.6); print('done')",
      ].map(quote).join(" ");
      const output = await new Deno.Command("script", {
        args: ["-qefc", command, "/dev/null"],
        env: { NO_COLOR: "1", KCORAL_URL: "" },
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = decoder.decode(output.stdout);
      assertEquals(output.code, 0, text + decoder.decode(output.stderr));
      assert.match(
        text,
        /\rkcoral: (running|queued|sending request|waiting for the server), \d+ s/,
      );
      // One line rewritten in place: the only newline is the remote output's.
      assertEquals(text.indexOf("\n"), text.length - 1, JSON.stringify(text));
      const erased = text.lastIndexOf("\r\x1b[K");
      assert.ok(erased >= 0 && erased < text.indexOf("done"), JSON.stringify(text));
      assertEquals(text.slice(erased), "\r\x1b[Kdone\r\n");
    });

    await t.step("a stopped server is a transport error", async () => {
      await server.stop();
      stopped = true;
      const result = await run(["python", "--", "-c", "pass"]);
      expectRun(result, 1, "", /^kcoral run python: TransportError: cannot connect to /);
    });
  } finally {
    if (!stopped) await server.stop();
    await Deno.remove(temp, { recursive: true });
  }
});
