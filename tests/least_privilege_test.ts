/**
 * The client commands run with the narrow permissions docs/permissions.md lists, on a terminal
 * (a pseudo-terminal from `script`, where Deno would prompt for anything not granted): no
 * prompt, no stack trace, the normal answer. And the table's command lines are the ones tested.
 */
import assert from "node:assert/strict";
import { startServer } from "./_server.ts";

const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname);

/** Runs `deno ARGS` in `cwd` on a pseudo-terminal; its exit code and everything it printed. */
async function onTerminal(args: string[], cwd: string): Promise<{ code: number; output: string }> {
  const quoted = [Deno.execPath(), ...args].map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(" ");
  const child = new Deno.Command("script", {
    // -e: the command's exit code; stdin stays open (piped) so a prompt would wait, not fail.
    args: ["-qec", `timeout 60 ${quoted}`, "/dev/null"],
    cwd,
    env: { NO_COLOR: "1", PATH: Deno.env.get("PATH") ?? "", HOME: Deno.env.get("HOME") ?? "" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const output = await child.output();
  const text = new TextDecoder().decode(output.stdout) + new TextDecoder().decode(output.stderr);
  return { code: output.code, output: text };
}

Deno.test("least privilege: health and run with --allow-net=HOST:PORT (and --allow-read=.) on a terminal", async () => {
  const server = await startServer();
  const cwd = await Deno.makeTempDir({ prefix: "kcoral-narrow-" });
  try {
    const host = new URL(server.url).host;
    await Deno.writeTextFile(`${cwd}/check.py`, "print(6 * 7)\n");
    const documented = await Deno.readTextFile(`${ROOT}docs/permissions.md`);
    const health = ["run", `--allow-net=${host}`, `${ROOT}cli.ts`, "health", "--url", server.url];
    assert.ok(documented.includes("deno run --allow-net=HOST:PORT"), "health's line");
    const healthy = await onTerminal(health, cwd);
    assert.equal(healthy.code, 0, healthy.output);
    assert.match(healthy.output, /: ok \(server\)/);
    assert.doesNotMatch(healthy.output, /Deno requests|Allow\?|NotCapable|at async/);

    const run = [
      "run",
      `--allow-net=${host}`,
      "--allow-read=.",
      `${ROOT}cli.ts`,
      "run",
      "python",
      "--url",
      server.url,
      "--send",
      "check.py",
      "--",
      "check.py",
    ];
    assert.ok(documented.includes("deno run --allow-net=HOST:PORT --allow-read=."), "run's line");
    const ran = await onTerminal(run, cwd);
    assert.equal(ran.code, 0, ran.output);
    assert.match(ran.output, /^42\r?$/m);
    assert.doesNotMatch(ran.output, /Deno requests|Allow\?|NotCapable/);
  } finally {
    await server.stop();
    await Deno.remove(cwd, { recursive: true });
  }
});

Deno.test("least privilege: the client alone needs only --allow-net=HOST:PORT, without a prompt", async () => {
  const server = await startServer();
  const cwd = await Deno.makeTempDir({ prefix: "kcoral-narrow-" });
  try {
    const script = `${cwd}/client.ts`;
    await Deno.writeTextFile(
      script,
      [
        `import { Client, Program } from "${ROOT}client/mod.ts";`,
        "const program = new Program();",
        'const m = program.upload({ kind: "module", source: "def f():\\n    return 42\\n" });',
        'program.return_({ key: "y", value: program.run({ fn: program.getFunction({ module: m, name: "f" }) }) });',
        `await using client = new Client("${server.url}");`,
        'console.log("answer", (await client.execute(program)).get("y"));',
      ].join("\n"),
    );
    const host = new URL(server.url).host;
    const result = await onTerminal(["run", `--allow-net=${host}`, script], cwd);
    assert.equal(result.code, 0, result.output);
    assert.match(result.output, /answer 42/);
    assert.doesNotMatch(result.output, /Deno requests|Allow\?/);
  } finally {
    await server.stop();
    await Deno.remove(cwd, { recursive: true });
  }
});
