/** `kcoral server` options: defaults, environment variables, precedence, validation, help. */
import assert from "node:assert/strict";
import { KcoralProcess } from "./_router.ts";
import { parseServerArgs, ServerArgsError, ServerHelp, serverHelpText } from "../cli/server.ts";
import {
  ConfigError,
  resolveServerConfig,
  type ServerConfig,
  serverConfigSchema,
} from "../server/config.ts";
import { serverConfigOptions, serverListenOptions } from "../server/config_options.ts";
import type { OptionSpec } from "../options/spec.ts";
import { callProgram, postProgram } from "./_server.ts";

const ENV = { HOME: "/home/u" };

Deno.test("kcoral server: defaults follow the server guide", () => {
  const args = parseServerArgs([], ENV);
  assert.equal(args.host, "127.0.0.1");
  assert.equal(args.port, 8000);
  const config = resolveServerConfig(args.config);
  assert.equal(config.device, "gpu");
  assert.deepEqual(config.gpus, [0]);
  assert.equal(config.numWorkers, 1);
  assert.equal(config.workersPerGpu, 8);
  assert.equal(config.maxRequestsPerWorker, 1);
  assert.equal(config.workerTerminationGraceSeconds, 5);
  assert.equal(config.sandbox, "bubblewrap");
  assert.deepEqual(config.sandboxReadonlyPaths, []);
  assert.equal(config.workerWaitTimeoutSeconds, 1800);
  assert.equal(config.defaultTimeoutSeconds, 300);
  assert.equal(config.maxTimeoutSeconds, 900);
  assert.equal(config.maxRequestBytes, 268435456);
  assert.equal(config.maxResponseBytes, 268435456);
  assert.equal(config.outputLimitBytes, 1048576);
  assert.equal(config.maxOutputLimitBytes, 16777216);
  assert.equal(config.cacheCapacityBytes, 17179869184);
  assert.equal(config.diskCacheDir, "/home/u/.cache/kcoral/files");
  assert.equal(config.diskCacheCapacityMbytes, 16384);
  assert.equal(config.logDir, "logs");
  assert.equal(config.logConsole, true);
  assert.equal(config.logPrograms, true);
  assert.equal(config.simulateGpus, false);
});

Deno.test("kcoral server: every option reaches the configuration", () => {
  const args = parseServerArgs([
    "--host=0.0.0.0",
    "--port",
    "8123",
    "--device",
    "cpu",
    "--gpus",
    "0,1",
    "--num-workers",
    "3",
    "--workers-per-gpu",
    "2",
    "--max-requests-per-worker",
    "0",
    "--worker-termination-grace-seconds",
    "1.5",
    "--sandbox",
    "bubblewrap",
    "--sandbox-readonly-path",
    "/opt/a",
    "--sandbox-readonly-path",
    "/opt/b",
    "--worker-wait-timeout-seconds",
    "30",
    "--default-timeout-seconds",
    "60",
    "--max-timeout-seconds",
    "120",
    "--max-request-bytes",
    "1000",
    "--max-response-bytes",
    "2000",
    "--output-limit-bytes",
    "10",
    "--max-output-limit-bytes",
    "20",
    "--cache-capacity-bytes",
    "4096",
    "--disk-cache-dir",
    "/var/cache/k",
    "--disk-cache-capacity-mbytes",
    "7",
    "--log-dir",
    "logs with spaces",
    "--no-log-console",
    "--no-log-programs",
    "--no-gpu-gate",
  ], ENV);
  assert.equal(args.host, "0.0.0.0");
  assert.equal(args.port, 8123);
  assert.deepEqual(args.config, {
    device: "cpu",
    gpus: [0, 1],
    sandbox: "bubblewrap",
    sandboxReadonlyPaths: ["/opt/a", "/opt/b"],
    logDir: "logs with spaces",
    logConsole: false,
    logPrograms: false,
    simulateGpus: false,
    gpuGate: false,
    numWorkers: 3,
    workersPerGpu: 2,
    maxRequestsPerWorker: 0,
    workerTerminationGraceSeconds: 1.5,
    workerWaitTimeoutSeconds: 30,
    defaultTimeoutSeconds: 60,
    maxTimeoutSeconds: 120,
    maxRequestBytes: 1000,
    maxResponseBytes: 2000,
    outputLimitBytes: 10,
    maxOutputLimitBytes: 20,
    cacheCapacityBytes: 4096,
    diskCacheCapacityMbytes: 7,
    diskCacheDir: "/var/cache/k",
  });
});

Deno.test("kcoral server: environment variables, and flags win over them", () => {
  const env = {
    ...ENV,
    KCORAL_SERVER_HOST: "10.0.0.1",
    KCORAL_SERVER_PORT: "9000",
    KCORAL_SERVER_DEVICE: "cpu",
    KCORAL_SERVER_GPUS: "2,3",
    KCORAL_LOG_DIR: "/var/log/k",
    XDG_CACHE_HOME: "/xdg",
  };
  const fromEnv = parseServerArgs([], env);
  assert.equal(fromEnv.host, "10.0.0.1");
  assert.equal(fromEnv.port, 9000);
  assert.equal(fromEnv.config.device, "cpu");
  assert.deepEqual(fromEnv.config.gpus, [2, 3]);
  assert.equal(fromEnv.config.logDir, "/var/log/k");
  assert.equal(fromEnv.config.diskCacheDir, "/xdg/kcoral/files");
  const flags = parseServerArgs(
    ["--host", "127.0.0.2", "--port", "9001", "--device", "gpu", "--gpus", "1", "--log-dir", ""],
    env,
  );
  assert.equal(flags.host, "127.0.0.2");
  assert.equal(flags.port, 9001);
  assert.equal(flags.config.device, "gpu");
  assert.deepEqual(flags.config.gpus, [1]);
  assert.equal(flags.config.logDir, null, "--log-dir '' disables log files");
  assert.equal(parseServerArgs(["--disk-cache-dir", ""], ENV).config.diskCacheDir, null);
  assert.equal(
    parseServerArgs([], { ...ENV, XDG_CACHE_HOME: "relative" }).config.diskCacheDir,
    "/home/u/.cache/kcoral/files",
    "XDG_CACHE_HOME counts only when absolute",
  );
});

/** The exit status and message `kcoral server` gives for `argv`, or 0 when it is accepted. */
function code(argv: string[], env: Record<string, string> = ENV) {
  try {
    parseServerArgs(argv, env);
    return 0;
  } catch (error) {
    assert.ok(error instanceof ServerArgsError, String(error));
    return [error.exitCode, error.message] as const;
  }
}

Deno.test("kcoral server: invalid settings exit 1, malformed command lines exit 2", () => {
  assert.deepEqual(code(["--port", "0"]), [1, "--port must be between 1 and 65535"]);
  assert.deepEqual(code(["--port", "70000"]), [1, "--port must be between 1 and 65535"]);
  assert.deepEqual(code(["--num-workers", "0"]), [1, "--num-workers must be at least 1"]);
  assert.deepEqual(code(["--workers-per-gpu", "0"]), [1, "--workers-per-gpu must be at least 1"]);
  assert.deepEqual(code(["--max-requests-per-worker", "-1"]), [
    1,
    "--max-requests-per-worker must be non-negative",
  ]);
  assert.deepEqual(code(["--disk-cache-capacity-mbytes", "-1"]), [
    1,
    "--disk-cache-capacity-mbytes must be non-negative",
  ]);
  assert.deepEqual(code(["--gpus", ","]), [1, "--gpus needs at least one GPU id"]);
  assert.equal(code(["--gpus", ",", "--device", "cpu"]), 0, "CPU mode ignores --gpus");
  assert.equal(code(["--preload-modules", "torch,xml.dom.minidom", "--device", "cpu"]), 0);
  for (const names of ["torch,os path", "torch;import os", "9lives", "torch..nn"]) {
    assert.deepEqual(code(["--preload-modules", names]), [
      1,
      "--preload-modules names a module that is not a dotted Python name",
    ]);
  }
  assert.deepEqual(code(["--sandbox", "none", "--sandbox-readonly-path", "/opt"]), [
    1,
    "--sandbox-readonly-path requires --sandbox bubblewrap",
  ]);
  for (
    const argv of [["--port", "abc"], ["--device", "tpu"], ["--bogus"], ["extra"], ["--gpus", "a"]]
  ) {
    const result = code(argv);
    assert.ok(Array.isArray(result) && result[0] === 2, `${argv}: ${result}`);
  }
  const badEnv = code([], { ...ENV, KCORAL_SERVER_DEVICE: "tpu" });
  assert.ok(Array.isArray(badEnv) && badEnv[0] === 2);
});

Deno.test("kcoral server: --help lists every option with its environment variable", () => {
  try {
    parseServerArgs(["--help"], ENV);
    assert.fail("help must be signalled");
  } catch (error) {
    assert.ok(error instanceof ServerHelp);
    for (
      const option of [
        "--host",
        "--port",
        "--device",
        "--gpus",
        "--num-workers",
        "--workers-per-gpu",
        "--max-requests-per-worker",
        "--worker-termination-grace-seconds",
        "--sandbox",
        "--sandbox-readonly-path",
        "--worker-wait-timeout-seconds",
        "--default-timeout-seconds",
        "--max-timeout-seconds",
        "--max-request-bytes",
        "--max-response-bytes",
        "--output-limit-bytes",
        "--max-output-limit-bytes",
        "--cache-capacity-bytes",
        "--disk-cache-dir",
        "--disk-cache-capacity-mbytes",
        "--log-dir",
        "--no-log-console",
        "--no-log-programs",
        "KCORAL_SERVER_HOST",
        "KCORAL_SERVER_PORT",
        "KCORAL_SERVER_DEVICE",
        "KCORAL_SERVER_GPUS",
        "KCORAL_LOG_DIR",
      ]
    ) {
      assert.ok(error.text.includes(option), option);
    }
    assert.equal(error.text.includes("--simulate-gpus"), false, "test mode stays out of help");
  }
});

/** The `--help` text, with wrapped descriptions (on wide terminals) joined back into one line. */
function helpLines(env: Record<string, string>): string[] {
  const text = serverHelpText(env).replace(/\n {20,}/g, " ");
  return text.split("\n").map((line) => line.trim());
}

/** Every option of `kcoral server`, in `--help` order. */
const SERVER_OPTIONS: Record<string, OptionSpec> = {
  ...serverListenOptions,
  ...serverConfigOptions,
};

Deno.test("kcoral server: --help shows every table entry with the default it uses and its variable", () => {
  const lines = helpLines(ENV);
  const args = parseServerArgs([], ENV);
  const used: Record<string, unknown> = {
    ...resolveServerConfig(args.config),
    host: args.host,
    port: args.port,
  };
  for (const [field, spec] of Object.entries(SERVER_OPTIONS)) {
    const line = lines.find((l) => l.startsWith(`${spec.flag} `));
    if (spec.hidden) {
      assert.equal(line, undefined, `${spec.flag} is hidden`);
      continue;
    }
    assert.ok(line, `${spec.flag} is in --help`);
    const shown = line.match(/\(default ([^)]*)\)/)?.[1];
    const value = used[field];
    const expected = typeof value === "boolean" || value === null ||
        (Array.isArray(value) && value.length === 0)
      ? undefined
      : Array.isArray(value)
      ? value.join(",")
      : String(value);
    assert.equal(shown?.split(" = ")[0], expected, `${spec.flag}: the default --help shows`);
    assert.equal(line.match(/\[env: (\w+)\]/)?.[1], spec.env, `${spec.flag}: its variable`);
  }
});

Deno.test("kcoral server: flags, variables and defaults are the server guide's (seed 002)", () => {
  // Flag → [default as --help shows it (undefined: none shown), environment variable].
  const guide: Record<string, [string | undefined, string?]> = {
    "--host": ["127.0.0.1", "KCORAL_SERVER_HOST"],
    "--port": ["8000", "KCORAL_SERVER_PORT"],
    "--device": ["gpu", "KCORAL_SERVER_DEVICE"],
    "--gpus": ["0", "KCORAL_SERVER_GPUS"],
    "--num-workers": ["1"],
    "--workers-per-gpu": ["8"],
    "--max-requests-per-worker": ["1"],
    "--worker-termination-grace-seconds": ["5"],
    "--sandbox": ["bubblewrap"],
    "--sandbox-readonly-path": [undefined],
    "--worker-wait-timeout-seconds": ["1800"],
    "--default-timeout-seconds": ["300"],
    "--max-timeout-seconds": ["900"],
    "--max-request-bytes": ["268435456 = 256 MiB"],
    "--max-response-bytes": ["268435456 = 256 MiB"],
    "--output-limit-bytes": ["1048576 = 1 MiB"],
    "--max-output-limit-bytes": ["16777216 = 16 MiB"],
    "--cache-capacity-bytes": ["17179869184 = 16 GiB"],
    "--disk-cache-dir": ["/home/u/.cache/kcoral/files"],
    "--disk-cache-capacity-mbytes": ["16384"],
    "--log-dir": ["logs", "KCORAL_LOG_DIR"],
    "--no-log-console": [undefined],
    "--no-log-programs": [undefined],
    // Not in the guide: the worker interpreter and JSON console lines (ours), and the hidden
    // test mode.
    "--python": ["python3", "KCORAL_PYTHON"],
    "--log-format": ["text", "KCORAL_LOG_FORMAT"],
    // Not in the guide: what stalled and flooding clients may hold (issue 44).
    "--header-timeout-seconds": ["10"],
    "--keep-alive-timeout-seconds": ["30"],
    "--body-timeout-seconds": ["30"],
    "--max-connections": ["1024"],
    // Not in the guide: modules each worker starts with (a CPU server that runs kcoral eval).
    "--preload-modules": [undefined, "KCORAL_SERVER_PRELOAD_MODULES"],
  };
  const lines = helpLines(ENV);
  const visible = Object.values(SERVER_OPTIONS).filter((spec) => !spec.hidden);
  assert.deepEqual(visible.map((spec) => spec.flag).sort(), Object.keys(guide).sort());
  for (const [flag, [shown, env]] of Object.entries(guide)) {
    const line = lines.find((l) => l.startsWith(`${flag} `)) ?? "";
    assert.equal(line.match(/\(default ([^)]*)\)/)?.[1], shown, flag);
    assert.equal(line.match(/\[env: (\w+)\]/)?.[1], env, flag);
  }
  // A configuration object's defaults differ from the command line's only for --log-dir.
  assert.equal(resolveServerConfig({}).logDir, null);
  assert.deepEqual(
    serverConfigSchema.defaults(ENV),
    resolveServerConfig({ ...parseServerArgs([], ENV).config, logDir: null }),
  );
});

Deno.test("kcoral server: every variable of the table is read, and its flag wins over it", () => {
  // Field → [variable's text, the value it gives, flag's text, the value it gives].
  const samples: Record<string, [string, unknown, string, unknown]> = {
    host: ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"],
    port: ["9000", 9000, "9001", 9001],
    device: ["cpu", "cpu", "gpu", "gpu"],
    gpus: ["2,3", [2, 3], "1", [1]],
    logDir: ["", null, "/var/log/k", "/var/log/k"],
    logFormat: ["json", "json", "text", "text"],
    python: ["/opt/py", "/opt/py", "/usr/bin/python3", "/usr/bin/python3"],
    preloadModules: ["torch", ["torch"], "numpy,torch.nn", ["numpy", "torch.nn"]],
  };
  const withEnv = Object.entries(SERVER_OPTIONS).filter(([, spec]) => spec.env !== undefined);
  assert.deepEqual(withEnv.map(([field]) => field).sort(), Object.keys(samples).sort());
  const valueOf = (args: ReturnType<typeof parseServerArgs>, field: string) =>
    field === "host" || field === "port" ? args[field] : args.config[field as keyof ServerConfig];
  for (const [field, spec] of withEnv) {
    const [envText, envValue, flagText, flagValue] = samples[field];
    const env = { ...ENV, [spec.env!]: envText };
    assert.deepEqual(valueOf(parseServerArgs([], env), field), envValue, spec.env);
    assert.deepEqual(
      valueOf(parseServerArgs([spec.flag, flagText], env), field),
      flagValue,
      `${spec.flag} wins over ${spec.env}`,
    );
  }
});

Deno.test("kcoral server: more settings that exit 1 and command lines that exit 2", () => {
  for (
    const [argv, message] of [
      [["--python", ""], "--python must not be empty"],
      [["--sandbox-readonly-path", ""], "--sandbox-readonly-path must not be empty"],
      [["--worker-wait-timeout-seconds", "0"], "--worker-wait-timeout-seconds must be positive"],
      [["--default-timeout-seconds", "-1"], "--default-timeout-seconds must be positive"],
      [["--max-request-bytes", "0"], "--max-request-bytes must be positive"],
      [["--output-limit-bytes", "-1"], "--output-limit-bytes must be non-negative"],
      [["--max-requests-per-worker", "-1"], "--max-requests-per-worker must be non-negative"],
    ] as [string[], string][]
  ) {
    assert.deepEqual(code(argv), [1, message]);
  }
  assert.deepEqual(code([], { ...ENV, KCORAL_SERVER_PORT: "0" }), [
    1,
    "--port must be between 1 and 65535",
  ]);
  assert.deepEqual(code(["--gpus", "-1"]), [
    2,
    "kcoral server: error: argument --gpus: invalid GPU id list: '-1'",
  ]);
  assert.deepEqual(code(["--num-workers", "1.5"]), [
    2,
    "kcoral server: error: argument --num-workers: invalid int value: '1.5'",
  ]);
  assert.deepEqual(code(["--max-timeout-seconds", "inf"]), [
    2,
    "kcoral server: error: argument --max-timeout-seconds: invalid float value: 'inf'",
  ]);
  assert.deepEqual(code([], { ...ENV, KCORAL_SERVER_PORT: "abc" }), [
    2,
    "kcoral server: error: argument KCORAL_SERVER_PORT: invalid int value: 'abc'",
  ]);
  assert.deepEqual(code(["--simulate-gpus", "--gpus", "0,1"]), 0, "the hidden option works");
});

Deno.test("kcoral server: configuration objects are checked against the same table", () => {
  const message = (input: Record<string, unknown>) => {
    try {
      resolveServerConfig(input as Partial<ServerConfig>);
      return "";
    } catch (error) {
      assert.ok(error instanceof ConfigError, String(error));
      return error.message;
    }
  };
  assert.equal(
    message({ numWorkers: 0 }),
    "invalid server configuration: numWorkers: must be at least 1",
  );
  assert.equal(
    message({ gpus: [-1] }),
    "invalid server configuration: gpus.0: must be non-negative",
  );
  assert.equal(
    message({ bogus: 1 }),
    'invalid server configuration: config: Unrecognized key: "bogus"',
  );
  assert.equal(message({ gpus: [] }), "--gpus needs at least one GPU id");
  assert.equal(message({ gpus: [], device: "cpu" }), "");
  assert.equal(
    message({ preloadModules: ["torch", "-c"] }),
    "--preload-modules names a module that is not a dotted Python name",
  );
  assert.equal(
    message({ sandbox: "none", sandboxReadonlyPaths: ["/opt"] }),
    "--sandbox-readonly-path requires --sandbox bubblewrap",
  );
  const config = resolveServerConfig({ logDir: "", diskCacheDir: "" });
  assert.equal(config.logDir, null);
  assert.equal(config.diskCacheDir, null);
  config.gpus.push(1);
  assert.deepEqual(resolveServerConfig({}).gpus, [0], "defaults are copied, never shared");
});

Deno.test("kcoral server: the process prints 'Application startup complete.' and stops on SIGTERM", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../cli.ts", import.meta.url).pathname,
      "server",
      "--device",
      "cpu",
      "--sandbox",
      "none",
      "--port",
      String(port),
      "--log-dir",
      "",
      "--disk-cache-dir",
      "",
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (!seen.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`server exited:\n${seen}`);
    seen += value;
  }
  const health = await (await fetch(`http://127.0.0.1:${port}/health`)).json();
  assert.equal(health.status, "ok");
  child.kill("SIGTERM");
  const drain = (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })();
  const status = await child.status;
  await drain;
  await child.stdout.cancel();
  assert.equal(status.code, 0);
});

/**
 * A `kcoral server` process (CPU, one worker) under a low descriptor limit (bash's ulimit), so a
 * few hundred descriptors exhaust it; `said()` is its stderr so far (plus what comes within
 * 500 ms).
 */
async function _limitedServer(nofile: number) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const cli = new URL("../cli.ts", import.meta.url).pathname;
  const command = `ulimit -n ${nofile} && exec "${Deno.execPath()}" run -A "${cli}" server ` +
    `--device cpu --num-workers 1 --sandbox none --port ${port} --log-dir '' --disk-cache-dir ''`;
  const child = new Deno.Command("bash", {
    args: ["-c", command],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  let pending: Promise<ReadableStreamReadResult<string>> | null = null;
  const stop = async () => {
    try {
      child.kill("SIGTERM");
    } catch {
      // it has ended already
    }
    const drain = (async () => {
      if (pending && (await pending).done) return;
      while (!(await reader.read()).done) { /* drain */ }
    })();
    await child.status;
    await drain;
  };
  while (!seen.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) {
      await stop();
      throw new Error(`server exited:\n${seen}`);
    }
    seen += value;
  }
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    /** Sends `signal` to the server process. */
    kill: (signal: Deno.Signal) => child.kill(signal),
    status: child.status,
    /** Everything it said so far: read until it has been quiet for 300 ms. */
    async said() {
      for (;;) {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const quiet = new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), 300));
        const more = await Promise.race([pending ??= reader.read(), quiet]);
        clearTimeout(timer);
        if (more === null) return seen;
        pending = null;
        if (more.done) return seen;
        seen += more.value;
      }
    },
    stop,
  };
}

Deno.test("kcoral server: running out of file descriptors does not end it: it accepts again", async () => {
  // A few hundred idle connections exhaust the limit: accepting fails until descriptors free up.
  const server = await _limitedServer(256);
  const port = server.port;
  const conns: Deno.TcpConn[] = [];
  try {
    for (let i = 0; i < 400; i++) {
      try {
        conns.push(await Deno.connect({ hostname: "127.0.0.1", port }));
      } catch {
        break; // the listener is gone (refused) once the limit was hit
      }
    }
    assert.ok(conns.length > 0);
    for (const conn of conns.splice(0)) conn.close();
    // Served again within a few seconds, by the same process.
    let health: { status?: string } = {};
    for (let i = 0; i < 100 && health.status !== "ok"; i++) {
      await new Promise((r) => setTimeout(r, 100));
      health = await fetch(`http://127.0.0.1:${port}/health`).then((r) => r.json(), () => ({}));
    }
    const said = await server.said();
    assert.equal(health.status, "ok", `not served again:\n${said}`);
    assert.match(
      said,
      /cannot accept connections \(retrying\): .*(Too many open files|os error 24)/,
    );
    assert.match(said, /accepting connections again/);
  } finally {
    for (const conn of conns) conn.close();
    await server.stop();
  }
});

Deno.test("kcoral server: an answer of more parts than descriptors is sent whole", async () => {
  // 400 binary parts of 4 KiB (1.6 MB: streamed) under a limit of 256 descriptors: each part
  // kept open until sent ran the process out of them (500).
  const server = await _limitedServer(256);
  try {
    const { Client, Program } = await import("../mod.ts");
    const program = new Program();
    const mod = program.upload({
      kind: "module",
      source: "def f():\n    return [bytes([i % 256]) * 4096 for i in range(400)]\n",
    });
    program.return_({
      key: "parts",
      value: program.run({ fn: program.getFunction({ module: mod, name: "f" }) }),
    });
    await using client = new Client(server.url);
    const result = await client.execute(program);
    assert.equal(
      result.status,
      "COMPLETED",
      `${JSON.stringify(result.error)}\n${await server.said()}`,
    );
    const parts = result.get<Uint8Array[]>("parts");
    assert.equal(parts.length, 400);
    assert.ok(parts.every((p, i) => p.length === 4096 && p[0] === i % 256 && p[4095] === i % 256));
  } finally {
    await server.stop();
  }
});

Deno.test("kcoral server: SIGTERM ends the process even while an upload stalls", async () => {
  const server = await _limitedServer(4096);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
  try {
    await conn.write(new TextEncoder().encode(
      "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
        "content-length: 1000\r\n\r\n--b\r\n",
    ));
    await new Promise((r) => setTimeout(r, 300));
    server.kill("SIGTERM");
    const ended = await Promise.race([
      server.status.then((status) => status.code),
      new Promise<string>((r) => setTimeout(() => r("still running after 10 s"), 10_000)),
    ]);
    assert.equal(ended, 0, await server.said());
  } finally {
    conn.close();
    await server.stop();
  }
});

Deno.test("kcoral server: repeated SIGINT/SIGTERM keep draining; both requests finish, exit 0", async () => {
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    const logDir = await Deno.makeTempDir({ prefix: "kcoral-drain-" });
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (listener.addr as Deno.NetAddr).port;
    listener.close();
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../cli.ts", import.meta.url).pathname,
        "server",
        "--device",
        "cpu",
        "--num-workers",
        "2",
        "--sandbox",
        "none",
        "--port",
        String(port),
        "--log-dir",
        logDir,
        "--no-log-console",
        "--disk-cache-dir",
        "",
      ],
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let said = "";
    while (!said.includes("Application startup complete.")) {
      const { value, done } = await output.read();
      if (done) throw new Error(`server exited:\n${said}`);
      said += value;
    }
    const drained = (async () => {
      for (;;) {
        const { value, done } = await output.read();
        if (done) return;
        said += value;
      }
    })();
    const url = `http://127.0.0.1:${port}`;
    const sleep = (seconds: number) =>
      postProgram(
        url,
        callProgram("import time\ndef f(s):\n    time.sleep(s)\n    return s\n", "f", [seconds]),
      );
    const requests = [sleep(0.8), sleep(1.6)];
    for (;;) {
      const health = await (await fetch(`${url}/health`)).json();
      if (health.load.requests_in_progress === 2) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    child.kill(signal);
    for (let i = 0; i < 3; i++) {
      await new Promise((resolve) => setTimeout(resolve, 30));
      child.kill(signal);
    }
    const responses = await Promise.all(requests);
    const status = await child.status;
    await drained;
    await child.stdout.cancel();
    try {
      for (const response of responses) {
        assert.equal(response.status, 200, said);
        assert.equal(response.json.status, "COMPLETED", said);
      }
      assert.equal(status.code, 0, said);
      assert.ok(said.includes("Shutdown requested. Finishing remaining benchmarks: 2 left."), said);
      assert.ok(said.includes("Finishing remaining benchmarks: 1 left."), said);
      assert.equal(said.includes("Forced exit"), false, said);
      const run = [...Deno.readDirSync(`${logDir}/runs`)][0].name;
      const events = Deno.readTextFileSync(`${logDir}/runs/${run}/events.jsonl`).trim().split("\n")
        .map((line) => JSON.parse(line));
      const started = events.findIndex((e) => e.event === "shutdown_started");
      assert.ok(started > 0);
      assert.equal(events.slice(started).some((e) => e.event === "worker_ready"), false);
      assert.ok(events.some((e) => e.event === "shutdown_complete"));
      assert.deepEqual(
        events.filter((e) => e.event === "shutdown_waiting").map((e) => e.remaining),
        [1, 0],
      );
    } finally {
      await Deno.remove(logDir, { recursive: true });
    }
  }
});

Deno.test("kcoral server --router: a --host that does not resolve is a usage error (exit 2)", async () => {
  const node = new KcoralProcess([
    "server",
    "--router",
    "http://127.0.0.1:9",
    "--node-id",
    "cpu-a",
    "--host",
    "no-such-host.invalid",
  ]);
  // Without the check the supervisor would restart its server forever: a limit, not a hang.
  let timer: ReturnType<typeof setTimeout> | undefined;
  const status = await Promise.race([
    node.status,
    new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), 30_000))),
  ]);
  clearTimeout(timer);
  if (status === null) await node.stop(1000);
  assert.equal(status?.code, 2, node.lines.join("\n"));
  assert.ok(
    node.lines.some((line) =>
      /^kcoral server: error: cannot resolve --host 'no-such-host\.invalid': .+$/.test(line)
    ),
    node.lines.join("\n"),
  );
});

Deno.test("kcoral server: --help shows the node options but not the supervisor's (seed 003)", () => {
  const help = serverHelpText(ENV);
  assert.ok(help.includes("add --router and --node-id to join a Router"));
  for (const flag of ["--router", "--node-id", "--node-token"]) {
    assert.ok(help.includes(flag), flag);
  }
  for (const hidden of ["--health-interval-seconds", "--restart-jitter", "--failure-threshold"]) {
    assert.ok(!help.includes(hidden), hidden);
  }
  assert.deepEqual(code(["--restart-jitter=0.2"]), [
    2,
    "kcoral server: error: --restart-jitter requires --router",
  ]);
  assert.deepEqual(code(["--router", "http://127.0.0.1:9000"]), [
    1,
    "--router and --node-id must be configured together",
  ]);
  const routed = parseServerArgs(
    ["--router", "http://127.0.0.1:9000", "--node-id", "cpu-a", "--health-interval-seconds=0.25"],
    ENV,
  );
  assert.equal(routed.node.nodeId, "cpu-a");
  assert.equal(routed.node.healthIntervalSeconds, 0.25);
  assert.equal(parseServerArgs([], ENV).node.routerEndpoint, null);
});
