/**
 * Upstream's worker-side `kcoral` (`kcoral.builtins`, `kcoral.errors`) and `kcoral_runtime` in
 * every process a request starts: a `kcoral run python` script, a `kcoral run shell` command
 * that runs Python, and a grandchild, against a live local CPU server (tests/_server.ts) with
 * and without bubblewrap, fresh and reused workers. Each imports the very files an uploaded
 * program imports in process: the runtime's own, its compat copy of `kcoral`. A client's
 * `-e PYTHONPATH=...` comes first and keeps them. A bubblewrap server whose probe fails makes
 * these tests fail (never a silent pass without isolation): CI installs `bubblewrap`.
 *
 * @module
 */
import assert from "node:assert/strict";
import type { ServerConfig } from "../server/config.ts";
import { runtimePythonPath } from "../server/runtime/runtime_files.ts";
import { callProgram, postProgram, startServer, type TestServer } from "./_server.ts";

const CLI = new URL("../cli.ts", import.meta.url).pathname;

/** The files of the modules a process imports, as one line of JSON. */
const IMPORTS = "import json, kcoral, kcoral.builtins, kcoral.errors, kcoral_runtime\n" +
  "print(json.dumps({'kcoral': kcoral.__file__, 'builtins': kcoral.builtins.__file__,\n" +
  "                  'errors': kcoral.errors.__file__, 'kcoral_runtime': kcoral_runtime.__file__}))";
/** The same, in process: `f()` returns that line. */
const IN_PROCESS = "import contextlib, io\n" +
  "def f(code):\n" +
  "    out = io.StringIO()\n" +
  "    with contextlib.redirect_stdout(out):\n" +
  "        exec(code, {})\n" +
  "    return out.getvalue()\n";
/** `python -c GRANDCHILD` starts `python -c IMPORTS`. */
const GRANDCHILD = "import subprocess, sys\n" +
  `sys.exit(subprocess.run([sys.executable, '-c', ${JSON.stringify(IMPORTS)}]).returncode)`;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** `deno run -A cli.ts run ARGS...` against `url`. */
async function kcoralRun(url: string, args: string[]): Promise<Run> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, "run", ...args],
    env: { KCORAL_URL: url, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}

/** The files a process importing the runtime's `kcoral` sees, with the runtime at `root`. */
function runtimeFiles(root: string): Record<string, string> {
  const compat = `${root}/kcoral_runtime/compat/kcoral`;
  return {
    kcoral: `${compat}/__init__.py`,
    builtins: `${compat}/builtins.py`,
    errors: `${compat}/errors.py`,
    kcoral_runtime: `${root}/kcoral_runtime/__init__.py`,
  };
}

/** What `run` printed: exit 0, nothing on stderr, one JSON line. */
function printed(run: Run): unknown {
  const shown = `exit ${run.code}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
  assert.equal(run.code, 0, shown);
  assert.equal(run.stderr, "", shown);
  return JSON.parse(run.stdout);
}

/** A server of `config` that must really run in the sandbox it asks for. */
async function server(config: Partial<ServerConfig>): Promise<TestServer> {
  const started = await startServer({ numWorkers: 1, diskCacheDir: null, ...config });
  if (started.app.sandbox !== config.sandbox) {
    const reason = started.events.find((e) => e.event === "sandbox_disabled")?.error;
    await started.stop();
    throw new Error(
      `bubblewrap isolation did not start on this machine, so the sandboxed case is untested: ` +
        `${reason} (install bubblewrap and allow unprivileged user namespaces)`,
    );
  }
  return started;
}

const CASES: { sandbox: "none" | "bubblewrap"; maxRequestsPerWorker: number }[] = [
  { sandbox: "none", maxRequestsPerWorker: 1 },
  { sandbox: "none", maxRequestsPerWorker: 0 },
  { sandbox: "bubblewrap", maxRequestsPerWorker: 1 },
  { sandbox: "bubblewrap", maxRequestsPerWorker: 0 },
];

for (const { sandbox, maxRequestsPerWorker } of CASES) {
  const workers = maxRequestsPerWorker === 1 ? "fresh" : "reused";
  Deno.test(`kcoral run scripts import kcoral and kcoral_runtime (--sandbox ${sandbox}, ${workers} workers)`, async (t) => {
    const live = await server({ sandbox, maxRequestsPerWorker });
    try {
      const root = sandbox === "bubblewrap" ? "/kcoral/runtime" : await runtimePythonPath();
      const expected = runtimeFiles(root);
      const { status, json } = await postProgram(
        live.url,
        callProgram(IN_PROCESS, "f", [IMPORTS]),
      );
      assert.equal(status, 200, JSON.stringify(json));
      assert.equal(json.status, "COMPLETED", JSON.stringify(json.error));
      const here = JSON.parse((json.results as { out: { value: string } }).out.value);
      assert.deepEqual(here, expected, "an uploaded program imports the runtime's compat copy");

      await t.step("kcoral run python", async () => {
        assert.deepEqual(printed(await kcoralRun(live.url, ["python", "--", "-c", IMPORTS])), here);
      });
      await t.step("kcoral run shell -- python3", async () => {
        const run = await kcoralRun(live.url, ["shell", "--", "python3", "-c", IMPORTS]);
        assert.deepEqual(printed(run), here);
      });
      await t.step("a grandchild of the script", async () => {
        const run = await kcoralRun(live.url, ["python", "--", "-c", GRANDCHILD]);
        assert.deepEqual(printed(run), here);
      });
      await t.step("-e PYTHONPATH comes first and keeps the runtime's entries", async () => {
        const code = "import json, os, sys\n" +
          "print(json.dumps(os.environ['PYTHONPATH'].split(os.pathsep)[:2]))\n" +
          "sys.stdout.flush()\n" + IMPORTS;
        const run = await kcoralRun(live.url, [
          "python",
          "-e",
          "PYTHONPATH=/client/modules:/more",
          "--",
          "-c",
          code,
        ]);
        const [first, ...rest] = run.stdout.split("\n");
        assert.deepEqual(JSON.parse(first), ["/client/modules", "/more"]);
        assert.deepEqual(printed({ ...run, stdout: rest.join("\n") }), here);
      });
    } finally {
      await live.stop();
    }
  });
}
