// Tests of `kcoral run` / `kcoral run TOOL` argument parsing (cli/run/args.ts): upstream
// KCoral's acceptance cases (spec cli.md §6.1 items 1-2, §6.2 exit-2 table and host/port
// matrix), argparse behaviours, messages, and help texts.

import assert from "node:assert/strict";
import {
  parseRunArgs,
  parseRunDispatcher,
  type RunArgsError,
  type RunArgsOk,
  type RunArgsResult,
} from "./args.ts";
import { TOOL_NAMES, type ToolName } from "./tools.ts";

const URL_ENV = { KCORAL_URL: "http://unused" };

function assertEquals(actual: unknown, expected: unknown, message?: string): void {
  assert.deepStrictEqual(actual, expected, message);
}

function ok(result: RunArgsResult): RunArgsOk {
  assert(result.kind === "ok", `expected success, got ${JSON.stringify(result)}`);
  return result;
}

function error(result: RunArgsResult | ReturnType<typeof parseRunDispatcher>): RunArgsError {
  assert(result.kind === "error", `expected an error, got ${JSON.stringify(result)}`);
  assertEquals(result.exitCode, 2);
  return result;
}

function parse(
  tool: string,
  line: string,
  env: Record<string, string | undefined> = URL_ENV,
) {
  return parseRunArgs(tool, line === "" ? [] : line.split(" "), env);
}

Deno.test("shared options and the native argument boundary (cli.md §6.1 item 1)", () => {
  const result = ok(parseRunArgs(
    "python",
    ("--host gpu.example --port 9000 -e LOCAL_VALUE -e MODE=debug --send experiment " +
      "--output-limit-bytes 524288 -- check.py --host native").split(" "),
    { KCORAL_URL: "http://environment", LOCAL_VALUE: "copied" },
  ));
  assertEquals(result.url, "http://gpu.example:9000");
  assertEquals(result.env, { LOCAL_VALUE: "copied", MODE: "debug" });
  assertEquals(result.send, ["experiment"]);
  assertEquals(result.outputLimitBytes, 524288);
  assertEquals(result.timeoutSeconds, 300);
  assertEquals(result.forwarded, ["check.py", "--host", "native"]);
  assertEquals(result.fetch, []);
  assertEquals(result.out, undefined);
  assertEquals(result.warnings, [
    "kcoral: warning: --host/--port override KCORAL_URL; using http://gpu.example:9000",
  ]);
});

Deno.test("defaults come from KCORAL_URL", () => {
  const result = ok(parse("shell", "-- echo hi", { KCORAL_URL: "https://gpu.example/prefix" }));
  assertEquals(result.url, "https://gpu.example/prefix");
  assertEquals(result.timeoutSeconds, 300);
  assertEquals(result.outputLimitBytes, 268435456);
  assertEquals(result.send, []);
  assertEquals(result.env, {});
  assertEquals(result.warnings, []);
  assertEquals(result.tool, "shell");
});

const INVALID: [ToolName, string, string][] = [
  // cli.md §6.1 item 2
  ["python", "-- -i check.py", "interactive Python execution is unsupported"],
  ["python", "--output-limit-bytes 0 -- check.py", "--output-limit-bytes must be positive"],
  [
    "python",
    "-e CUDA_VISIBLE_DEVICES=0 -- check.py",
    "CUDA_VISIBLE_DEVICES is managed by the remote worker",
  ],
  [
    "ncu",
    "--out reports -- --export=custom -- python check.py",
    "--export conflicts with managed remote capture paths or mode",
  ],
  [
    "run-iket",
    "--out reports -- profile",
    "separate profiler options from the application with another '--'",
  ],
  // cli.md §6.2 exit-2 table
  ["python", "-- -i", "interactive Python execution is unsupported"],
  [
    "python",
    "-- -",
    "a script, -c command, or -m module is required; stdin execution is unsupported",
  ],
  ["python", "-- -c", "Python -c requires an argument"],
  ["python", "--send x", "separate KCoral options from tool arguments with '--'"],
  [
    "python",
    "-e CUDA_VISIBLE_DEVICES=1 -- x.py",
    "CUDA_VISIBLE_DEVICES is managed by the remote worker",
  ],
  ["python", "-e KCORAL_DIR=/tmp -- x.py", "KCORAL_DIR is managed by the remote worker"],
  ["python", "-e BAD-NAME=x -- x.py", "environment variable names must be identifiers"],
  ["python", "--timeout 0 -- x.py", "--timeout must be positive"],
  ["python", "--fetch ../x --out out -- x.py", "expected a relative file path: '../x'"],
  [
    "ncu",
    "--out o -- --export=x -- app",
    "--export conflicts with managed remote capture paths or mode",
  ],
  ["ncu", "--out o -- -ifile -- app", "-ifile conflicts with managed remote capture paths or mode"],
  [
    "ncu",
    "--out o -- --mode=attach -- app",
    "--mode conflicts with managed remote capture paths or mode",
  ],
  [
    "run-iket",
    "--out o -- --output-dir=x profile -- app",
    "--output-dir conflicts with managed remote capture paths or mode",
  ],
  [
    "run-iket",
    "--out o -- profile --postprocess json python x.py",
    "separate profiler options from the application with another '--'",
  ],
];

Deno.test("invalid command lines exit 2 with upstream's messages", () => {
  for (const [tool, line, message] of INVALID) {
    const result = error(parse(tool, line));
    assertEquals(result.message, message, `${tool} ${line}`);
    assertEquals(
      result.text.split("\n").at(-2),
      `kcoral run ${tool}: error: ${message}`,
      `${tool} ${line}`,
    );
    assert(result.text.startsWith(`usage: kcoral run ${tool} [-h]`), result.text);
    assert(result.text.endsWith("\n"));
  }
});

Deno.test("python accepts its own option syntax", () => {
  const accepted = [
    "check.py",
    "-c pass",
    "-cpass",
    "-m pkg.mod",
    "-Wignore -X dev -m module -i",
    "-W ignore -X dev experiment/check.py",
    "-O -B -u check.py",
    "-OO -c pass",
    "--check-hash-based-pycs always check.py",
    "-- check.py",
    "-E -s -I script.py --url literal",
  ];
  for (const line of accepted) {
    assertEquals(ok(parse("python", `-- ${line}`)).forwarded, line.split(" "), line);
  }
  const refused: [string, string][] = [
    ["--version", "a script, -c command, or -m module is required; stdin execution is unsupported"],
    ["-- -", "a script, -c command, or -m module is required; stdin execution is unsupported"],
    ["--", "a script, -c command, or -m module is required; stdin execution is unsupported"],
    ["-Oi x.py", "interactive Python execution is unsupported"],
    ["-m", "Python -m requires an argument"],
    ["-W", "Python -W requires an argument"],
    ["-X dev", "a script, -c command, or -m module is required; stdin execution is unsupported"],
    [
      "--check-hash-based-pycs always",
      "a script, -c command, or -m module is required; stdin execution is unsupported",
    ],
  ];
  for (const [line, message] of refused) {
    assertEquals(error(parse("python", `-- ${line}`)).message, message, line);
  }
  assertEquals(error(parse("python", "--")).message, "arguments are required after '--'");
});

Deno.test("profiler arguments: separators, profile, managed options and abbreviations", () => {
  assertEquals(ok(parse("ncu", "--out o -- -- python capture.py")).forwarded, [
    "--",
    "python",
    "capture.py",
  ]);
  ok(parse("ncu", "--out o -- --set basic --launch-count 1 -- python capture.py"));
  ok(parse("ncu", "--out o -- --kernel-name regex:k.* --launch-skip 5 -- python c.py"));
  for (
    const option of [
      "--exp",
      "--e",
      "--m",
      "--co",
      "--config-file-path=x",
      "--import",
      "-o",
      "-ox",
      "-i",
    ]
  ) {
    const result = error(parse("ncu", `--out o -- ${option} -- app`));
    assertEquals(
      result.message,
      `${option.split("=")[0]} conflicts with managed remote capture paths or mode`,
    );
  }
  assertEquals(
    error(parse("ncu", "--out o -- --set basic --")).message,
    "expected profiler options followed by '-- application [args]'",
  );
  ok(parse("run-iket", "--out o -- profile --postprocess json -- python capture.py"));
  ok(parse("run-iket", "--out o -- --keep profile -- python capture.py"));
  for (
    const option of ["--output-dir", "--out", "--o", "--working-dir=w", "--work", "-o", "-oout"]
  ) {
    const result = error(parse("run-iket", `--out o -- profile ${option} -- app`));
    assertEquals(
      result.message,
      `${option.split("=")[0]} conflicts with managed remote capture paths or mode`,
    );
  }
  for (const line of ["--out o -- --postprocess json -- app", "--out o -- profile --"]) {
    assertEquals(
      error(parse("run-iket", line)).message,
      "expected profiler options followed by '-- application [args]'",
    );
  }
});

Deno.test("profilers require --out and do not accept --fetch", () => {
  for (const tool of ["ncu", "run-iket"] as const) {
    const native = tool === "ncu" ? "-- -- app" : "-- profile -- app";
    assertEquals(
      error(parse(tool, native)).message,
      "the following arguments are required: --out",
    );
    assertEquals(
      error(parse(tool, `--out o --fetch x ${native}`)).message,
      "unrecognized arguments: --fetch x",
    );
    const result = ok(parse(tool, `--out artifacts/${tool} ${native}`));
    assertEquals(result.out, `artifacts/${tool}`);
    assertEquals(result.fetch, []);
  }
});

Deno.test("--fetch and --out go together for the other tools", () => {
  for (const tool of ["python", "shell", "compute-sanitizer"] as const) {
    const native = tool === "python" ? "-- x.py" : "-- app";
    for (const options of ["--fetch results", "--out artifacts"]) {
      assertEquals(
        error(parse(tool, `${options} ${native}`)).message,
        "--fetch and --out must be used together",
      );
    }
    const result = ok(parse(tool, `--fetch results --fetch a/b.log --out artifacts ${native}`));
    assertEquals(result.fetch, ["results", "a/b.log"]);
    assertEquals(result.out, "artifacts");
  }
  for (const bad of ["/abs", "a/../b", "..", ".", "./", "a\\b"]) {
    assertEquals(
      error(parseRunArgs("python", ["--fetch", bad, "--out", "o", "--", "x.py"], URL_ENV)).message,
      `expected a relative file path: '${bad.replace("\\", "\\\\")}'`,
    );
  }
  assertEquals(
    error(parseRunArgs("python", ["--fetch", "", "--out", "o", "--", "x.py"], URL_ENV)).message,
    "expected a relative file path: ''",
  );
  assertEquals(
    error(parseRunArgs("python", ["--fetch", "it's/../x", "--out", "o", "--", "x.py"], URL_ENV))
      .message,
    `expected a relative file path: "it's/../x"`,
  );
});

Deno.test("environment entries", () => {
  const local = { ...URL_ENV, LOCAL_VALUE: "copied", EMPTY_LOCAL: "" };
  const result = ok(parseRunArgs(
    "shell",
    [
      "-e",
      "MODE=debug",
      "--env",
      "LABEL=trial one",
      "-e",
      "LOCAL_VALUE",
      "-e",
      "EMPTY=",
      "-e",
      "EMPTY_LOCAL",
      "-eMODE=release",
      "--env=EQ=a=b",
      "-e=_under_9=x",
      "--",
      "env",
    ],
    local,
  ));
  assertEquals(result.env, {
    MODE: "release",
    LABEL: "trial one",
    LOCAL_VALUE: "copied",
    EMPTY: "",
    EMPTY_LOCAL: "",
    EQ: "a=b",
    _under_9: "x",
  });
  assertEquals(Object.keys(result.env)[0], "MODE", "the last value keeps the first position");
  const proto = ok(parseRunArgs("shell", ["-e", "__proto__=x", "--", "env"], URL_ENV));
  assertEquals(Object.hasOwn(proto.env, "__proto__"), true);
  assertEquals(proto.env["__proto__"], "x");
  const cases: [string[], string][] = [
    [["-e", "MISSING"], "local environment variable MISSING is not set"],
    [["-e", "toString"], "local environment variable toString is not set"],
    [["-e", "1ABC=x"], "environment variable names must be identifiers"],
    [["-e", "=x"], "environment variable names must be identifiers"],
    [["-e", "A B=x"], "environment variable names must be identifiers"],
    [["-e", "X=a\0b"], "environment variable X contains NUL"],
    [["-e", "KCORAL_DIR"], "KCORAL_DIR is managed by the remote worker"],
    [["-e", "CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES is managed by the remote worker"],
  ];
  for (const [options, message] of cases) {
    assertEquals(error(parseRunArgs("shell", [...options, "--", "env"], local)).message, message);
  }
});

Deno.test("connection: no server selected", () => {
  for (const env of [{}, { KCORAL_URL: "" }]) {
    assertEquals(
      error(parse("python", "-- x.py", env)).message,
      "set KCORAL_URL or pass --url, --host or --port",
    );
  }
  assertEquals(ok(parse("python", "--url http://flag -- x.py", {})).url, "http://flag");
  const flag = ok(parse("python", "--url https://flag.example/p -- x.py", URL_ENV));
  assertEquals(flag.url, "https://flag.example/p");
  assertEquals(flag.warnings, [], "--url overrides KCORAL_URL silently");
});

Deno.test("connection: host/port matrix with and without KCORAL_URL", () => {
  const matrix: [string, string][] = [
    ["--host gpu.example --port 9000", "http://gpu.example:9000"],
    ["--host gpu.example", "http://gpu.example:8000"],
    ["--port 9000", "http://127.0.0.1:9000"],
    ["--host 127.0.0.2 --port 65535", "http://127.0.0.2:65535"],
    ["--host ::1 --port 9000", "http://[::1]:9000"],
    ["--host [::1] --port 1", "http://[::1]:1"],
    ["--host 2001:db8::8a2e:370:7334", "http://[2001:db8::8a2e:370:7334]:8000"],
    ["--host ::ffff:192.0.2.1", "http://[::ffff:192.0.2.1]:8000"],
    ["--host=gpu.example --port=+80", "http://gpu.example:80"],
    ["--port 0080", "http://127.0.0.1:80"],
    ["--port 1_000", "http://127.0.0.1:1000"],
  ];
  for (const environmentUrl of [undefined, "https://environment.example:9443/prefix"]) {
    for (const [options, url] of matrix) {
      const env = environmentUrl === undefined ? {} : { KCORAL_URL: environmentUrl };
      const result = ok(parse("python", `${options} -- x.py`, env));
      assertEquals(result.url, url, options);
      assertEquals(
        result.warnings,
        environmentUrl === undefined
          ? []
          : [`kcoral: warning: --host/--port override KCORAL_URL; using ${url}`],
      );
    }
  }
});

Deno.test("connection: native --host/--port after -- are untouched", () => {
  const native = "-- x.py --host native-host --port invalid-for-kcoral";
  for (const [options, env] of [["--url http://flag", {}], ["", URL_ENV]] as const) {
    const result = ok(parse("python", `${options} ${native}`.trim(), env));
    assertEquals(result.forwarded, native.split(" ").slice(1));
    assertEquals(result.warnings, []);
  }
});

Deno.test("connection: every tool accepts --host/--port", () => {
  const native: Record<ToolName, string> = {
    python: "-- x.py",
    "compute-sanitizer": "-- app",
    ncu: "--out o -- -- app",
    "run-iket": "--out o -- profile -- app",
    shell: "-- app",
  };
  for (const tool of TOOL_NAMES) {
    const result = ok(parse(tool, `--host gpu.example --port 9000 ${native[tool]}`, {}));
    assertEquals(result.url, "http://gpu.example:9000");
    assertEquals(result.tool, tool);
  }
});

Deno.test("connection errors", () => {
  const hostMessage = "--host must be a hostname or IP address, without a scheme, port or path";
  const cases: [string[], string][] = [
    [["--port", "0"], "--port must be between 1 and 65535"],
    [["--port", "65536"], "--port must be between 1 and 65535"],
    [["--port", "-1"], "--port must be between 1 and 65535"],
    [["--port", "99999999999999999999999"], "--port must be between 1 and 65535"],
    [["--port", "abc"], "argument --port: invalid int value: 'abc'"],
    [["--port", "1.5"], "argument --port: invalid int value: '1.5'"],
    [["--port", ""], "argument --port: invalid int value: ''"],
    [["--port"], "argument --port: expected one argument"],
    [["--host", "gpu", "--url", "http://x"], "--url cannot be combined with --host or --port"],
    [["--url", "http://x", "--port", "1"], "--url cannot be combined with --host or --port"],
  ];
  for (
    const host of [
      "",
      "http://gpu",
      "gpu:9000",
      "gpu/path",
      "user@gpu",
      "a b",
      "[gpu]",
      "::x",
      "gpu?x",
      "gpu#x",
      "gpu\\x",
      "gpu\tx",
      "gpu\x7f",
      "gpu\u00a0x",
      "gpu%x",
      "[::1",
      "1:2:3:4:5:6:7:8:9",
      "1::2::3",
      ":1::",
      "::1.2.3.04",
      "fe80::1%eth0",
    ]
  ) {
    cases.push([["--host", host], hostMessage]);
  }
  for (const [options, message] of cases) {
    const result = error(parseRunArgs("python", [...options, "--", "x.py"], URL_ENV));
    assertEquals(result.message, message, JSON.stringify(options));
  }
});

Deno.test("the override warning is returned even when a later check fails", () => {
  const result = error(parse("python", "--port 9000 --timeout 0 -- x.py", URL_ENV));
  assertEquals(result.message, "--timeout must be positive");
  assertEquals(result.warnings, [
    "kcoral: warning: --host/--port override KCORAL_URL; using http://127.0.0.1:9000",
  ]);
  assertEquals(error(parse("python", "--port 0 -- x.py", URL_ENV)).warnings, []);
});

Deno.test("timeout and output limit are positive integers", () => {
  const result = ok(parse("python", "--timeout 600 --output-limit-bytes 8 -- x.py"));
  assertEquals([result.timeoutSeconds, result.outputLimitBytes], [600, 8]);
  const huge = ok(parse("python", "--timeout 99999999999999999999 -- x.py"));
  assertEquals(huge.timeoutSeconds, Number.MAX_SAFE_INTEGER);
  const cases: [string, string][] = [
    ["--timeout -5", "--timeout must be positive"],
    ["--timeout 1.5", "argument --timeout: invalid int value: '1.5'"],
    ["--output-limit-bytes -1", "--output-limit-bytes must be positive"],
    ["--output-limit-bytes 1e6", "argument --output-limit-bytes: invalid int value: '1e6'"],
  ];
  for (const [options, message] of cases) {
    assertEquals(error(parse("python", `${options} -- x.py`)).message, message);
  }
});

Deno.test("argparse behaviours: no abbreviations, values, repeats, order of errors", () => {
  const cases: [string[], string][] = [
    [["--time", "5"], "unrecognized arguments: --time 5"],
    [["--timeout=5", "stray"], "unrecognized arguments: stray"],
    [["--send"], "argument --send: expected one argument"],
    [["--send", "-x"], "argument --send: expected one argument"],
    [["-e"], "argument -e/--env: expected one argument"],
    [["--help=x"], "argument -h/--help: ignored explicit argument 'x'"],
    [["-hx"], "argument -h/--help: ignored explicit argument 'x'"],
    [["-he"], "argument -e/--env: expected one argument"],
    [["--port", "abc", "--time", "1"], "argument --port: invalid int value: 'abc'"],
    [["--bogus", "--out"], "argument --out: expected one argument"],
  ];
  for (const [options, message] of cases) {
    const result = error(parseRunArgs("python", [...options, "--", "x.py"], URL_ENV));
    assertEquals(result.message, message, JSON.stringify(options));
  }
  const result = ok(parseRunArgs(
    "python",
    [
      "--send",
      "a",
      "--send=-b",
      "--send",
      "-c d",
      "--url",
      "http://one",
      "--url=http://two",
      "--timeout",
      "5",
      "--timeout",
      " 7 ",
      "--",
      "x.py",
    ],
    {},
  ));
  assertEquals(result.send, ["a", "-b", "-c d"]);
  assertEquals(result.url, "http://two");
  assertEquals(result.timeoutSeconds, 7);
  assertEquals(
    error(parse("ncu", "--bogus -- -- app")).message,
    "the following arguments are required: --out",
    "missing required options are reported before unrecognized ones",
  );
});

Deno.test("help: tool help anywhere before -- and without a server", () => {
  for (const tool of TOOL_NAMES) {
    for (
      const argv of [["--help"], ["-h"], ["--send", "x", "-h"], ["-h", "--", "x"], [
        "--help",
        "--port",
        "abc",
        "--",
        "x",
      ]]
    ) {
      const result = parseRunArgs(tool, argv, {});
      assert(result.kind === "help", `${tool} ${argv.join(" ")}`);
      assertEquals(result.exitCode, 0);
      assert(result.text.startsWith(`usage: kcoral run ${tool} `), result.text);
      for (
        const option of [
          "-h, --help",
          "--url URL",
          "--host HOST",
          "--port PORT",
          "--timeout SECONDS",
          "--output-limit-bytes N",
          "--send PATH",
          "-e NAME[=VALUE], --env NAME[=VALUE]",
          "--out DIRECTORY",
          "KCORAL_URL",
          "268435456",
          "300",
        ]
      ) {
        assert(result.text.includes(option), `${tool} help lacks ${option}`);
      }
      assertEquals(result.text.includes("--fetch PATH"), tool !== "ncu" && tool !== "run-iket");
    }
  }
  assert.match((parseRunArgs("ncu", ["--help"], {}) as { text: string }).text, /capture\.ncu-rep/);
  // After the first --, --help is a native argument.
  assertEquals(ok(parse("shell", "-- ncu --help")).forwarded, ["ncu", "--help"]);
  // Actions run in order: an earlier bad value wins over a later --help.
  assertEquals(
    error(parseRunArgs("python", ["--port", "abc", "--help", "--", "x"], {})).message,
    "argument --port: invalid int value: 'abc'",
  );
});

Deno.test("dispatcher: kcoral run", () => {
  const missing = error(parseRunDispatcher([]));
  assertEquals(missing.message, "the following arguments are required: tool");
  assertEquals(
    missing.text,
    "usage: kcoral run [-h] {python,compute-sanitizer,ncu,run-iket,shell} ...\n" +
      "kcoral run: error: the following arguments are required: tool\n",
  );
  assertEquals(
    error(parseRunDispatcher(["unknown", "--help"])).message,
    "argument tool: invalid choice: 'unknown' (choose from 'python', 'compute-sanitizer', " +
      "'ncu', 'run-iket', 'shell')",
  );
  assertEquals(
    error(parseRunDispatcher(["--bogus"])).message,
    "the following arguments are required: tool",
  );
  assertEquals(
    error(parseRunDispatcher(["--help=x"])).message,
    "argument -h/--help: ignored explicit argument 'x'",
  );
  for (const argv of [["--help"], ["-h"], ["-h", "python"]]) {
    const help = parseRunDispatcher(argv);
    assert(help.kind === "help");
    assertEquals(help.exitCode, 0);
    assert(help.text.startsWith("usage: kcoral run [-h] {python,"));
    for (const tool of TOOL_NAMES) assert(help.text.includes(`\n    ${tool} `), tool);
  }
  const argv = ["--send", "x", "--", "-c", "a b", "--", "--help"];
  assertEquals(parseRunDispatcher(["python", ...argv]), { kind: "tool", tool: "python", argv });
  assertEquals(parseRunDispatcher(["ncu"]), { kind: "tool", tool: "ncu", argv: [] });
  assertEquals(
    error(parseRunArgs("bench", ["--", "x"], URL_ENV)).message,
    "argument tool: invalid choice: 'bench' (choose from 'python', 'compute-sanitizer', " +
      "'ncu', 'run-iket', 'shell')",
  );
});
