/**
 * `kcoral health` as a user runs it (a subprocess) against a real CPU server and a Router with
 * no node: the readable text, `--json`, exit statuses, and the errors for an unreachable URL and
 * a malformed command line.
 */
import assert from "node:assert/strict";
import { startServer } from "./_server.ts";
import { freePort, startRouter } from "./_router.ts";

const CLI = new URL("../cli.ts", import.meta.url).pathname;

async function kcoral(args: string[], env: Record<string, string> = {}) {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decode = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return { code: output.code, stdout: decode(output.stdout), stderr: decode(output.stderr) };
}

Deno.test("kcoral health: a CPU server, readable and --json; KCORAL_URL and --port select it", async () => {
  const server = await startServer();
  try {
    const text = await kcoral(["health", "--url", server.url]);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^${server.url}: ok \\(server\\)\\n`));
    assert.match(text.stdout, /\n {2}load {6}0 of 1 busy, 0 waiting\n/);
    assert.match(text.stdout, /\n {2}target {4}- \(a CPU server\)\n/);
    assert.match(text.stdout, /\n {2}GPUs {6}0\n/);

    const json = await kcoral(["health", "--json"], { KCORAL_URL: server.url });
    assert.equal(json.code, 0, json.stderr);
    const body = JSON.parse(json.stdout);
    assert.equal(body.status, "ok");
    assert.equal(body.load.request_capacity, 1);
    assert.equal(body.instance_id, server.app.health().instance_id);

    const port = new URL(server.url).port;
    const byPort = await kcoral(["health", "--port", port]);
    assert.equal(byPort.code, 0, byPort.stderr);
    assert.ok(byPort.stdout.startsWith(`http://127.0.0.1:${port}: ok`), byPort.stdout);
  } finally {
    await server.stop();
  }
});

Deno.test("kcoral health: a Router with no node answers unavailable, exit 1", async () => {
  const router = await startRouter();
  try {
    const result = await kcoral(["health", "--url", router.url]);
    assert.equal(result.code, 1, result.stderr);
    assert.match(result.stdout, /: unavailable \(Router\)\n/);
    assert.match(result.stdout, /\n {2}load {6}0 of 0 busy, 0 waiting\n/);
    assert.match(result.stdout, /target {4}- \(no node has joined\)/);
  } finally {
    await router.stop();
  }
});

Deno.test("kcoral health: unreachable, not KCoral, malformed command lines", async () => {
  const port = freePort();
  const down = await kcoral(["health", "--url", `http://127.0.0.1:${port}`, "--timeout", "5"]);
  assert.equal(down.code, 1);
  assert.match(
    down.stderr,
    new RegExp(`^kcoral health: cannot reach http://127.0.0.1:${port}/health: .*refused`),
  );

  await using other = Deno.serve({ port: 0, onListen() {} }, () => new Response("hello"));
  const foreign = await kcoral(["health", "--url", `http://127.0.0.1:${other.addr.port}`]);
  assert.equal(foreign.code, 1);
  assert.match(foreign.stderr, /answered HTTP 200 without a KCoral health body: hello/);

  const both = await kcoral(["health", "--url", "http://x:1", "--port", "2"]);
  assert.equal(both.code, 2);
  assert.match(both.stderr, /^usage: kcoral health \[-h\]/);
  assert.match(
    both.stderr,
    /kcoral health: error: --url cannot be combined with --host or --port\n$/,
  );

  const unknown = await kcoral(["health", "--bogus"]);
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /kcoral health: error: unrecognized arguments: --bogus\n$/);

  const version = await kcoral(["health", "--version"]);
  assert.equal(version.code, 0);
  assert.match(version.stdout, /^kcoral \d+\.\d+\.\d+\n$/);
});

Deno.test("kcoral --version, and each command's", async () => {
  for (
    const args of [["--version"], ["server", "--version"], ["router", "--version"], [
      "run",
      "--version",
    ], ["health", "--version"]]
  ) {
    const result = await kcoral(args);
    assert.equal(result.code, 0, `${args}: ${result.stderr}`);
    assert.match(result.stdout, /^kcoral \d+\.\d+\.\d+\n$/, args.join(" "));
  }
  const top = await kcoral(["--help"]);
  assert.match(
    top.stdout,
    /^usage: kcoral \[-h\] \[--version\] \{server,router,run,health,mcp,eval\}/,
  );
  assert.match(top.stdout, /\n {2}--version {13}show program's version number and exit/);
});
