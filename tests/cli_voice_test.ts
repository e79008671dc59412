/**
 * One CLI voice (cli/voice.ts): a malformed server URL is a usage error with a suggestion (exit 2)
 * for every client command; a refused connection reads alike in `run` and `health` and ends
 * with a hint; `kcoral run -v` names the request the server logged; option errors use argparse's
 * words; `server --help` is grouped with examples; a self-signed CA:TRUE certificate is named
 * with its fix.
 */
import assert from "node:assert/strict";
import { startServer } from "./_server.ts";
import { freePort } from "./_router.ts";

const CLI = new URL("../cli.ts", import.meta.url).pathname;

async function kcoral(args: string[], env: Record<string, string> = {}, cwd?: string) {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1", ...env },
    ...(cwd ? { cwd } : {}),
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return { code: output.code, stdout: text(output.stdout), stderr: text(output.stderr) };
}

Deno.test("cli voice: a malformed --url or KCORAL_URL is exit 2 with a suggestion, for each command", async () => {
  const cases: [string[], Record<string, string>, RegExp][] = [
    [
      ["health", "--url", "notaurl"],
      {},
      /kcoral health: error: argument --url: .*'notaurl' \(did you mean http:\/\/notaurl\?\)/,
    ],
    [
      ["health"],
      { KCORAL_URL: "gpu-box:8000" },
      /argument KCORAL_URL: .*did you mean http:\/\/gpu-box:8000\?/,
    ],
    [
      ["run", "python", "--url", "localhost:8000", "--", "-c", "pass"],
      {},
      /kcoral run python: error: argument --url: .*did you mean http:\/\/localhost:8000\?/,
    ],
    [
      ["run", "python", "--", "-c", "pass"],
      { KCORAL_URL: "ftp://x" },
      /argument KCORAL_URL: not an http:\/\/ or https:\/\/ URL: 'ftp:\/\/x'/,
    ],
    [
      ["mcp", "--url", "localhost:8000"],
      {},
      /kcoral mcp: error: argument --url: .*did you mean http:\/\/localhost:8000\?/,
    ],
  ];
  for (const [args, env, pattern] of cases) {
    const result = await kcoral(args, env);
    assert.equal(result.code, 2, `${args.join(" ")}: ${result.stderr}`);
    assert.match(result.stderr, pattern);
    assert.doesNotMatch(result.stderr, /at async|Uncaught/);
  }
});

Deno.test("cli voice: a refused connection reads alike in run and health, with a hint", async () => {
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const run = await kcoral(["run", "python", "--url", url, "--", "-c", "pass"]);
  const health = await kcoral(["health", "--url", url]);
  const said = `cannot connect to 127.0.0.1:${port}: Connection refused`;
  for (const result of [run, health]) {
    assert.equal(result.code, 1, result.stderr);
    assert.ok(result.stderr.includes(said), result.stderr);
    assert.match(result.stderr, new RegExp(`\\nhint: is a KCoral server running at ${url}\\?`));
  }
});

Deno.test("cli voice: kcoral run -v prints the request id the server logged, and the timings", async () => {
  const server = await startServer();
  try {
    const ids: string[] = [];
    server.app.subscribe((record) => {
      if (record.event === "request_finished" && record.finish_reason === "completed") {
        ids.push(String(record.request_id));
      }
    });
    const result = await kcoral([
      "run",
      "python",
      "-v",
      "--url",
      server.url,
      "--",
      "-c",
      "print(3)",
    ]);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout, "3\n");
    const line =
      /^kcoral: request (\S+): COMPLETED, queued [\d.]+ ms, GPU lease wait [\d.]+ ms, held [\d.]+ ms, elapsed [\d.]+ ms$/m
        .exec(result.stderr);
    assert.ok(line, result.stderr);
    assert.ok(ids.includes(line[1]), `${line[1]} not in ${ids}`);
    const quiet = await kcoral(["run", "python", "--url", server.url, "--", "-c", "print(3)"]);
    assert.equal(quiet.stderr, "");
  } finally {
    await server.stop();
  }
});

Deno.test("cli voice: option errors in argparse's words; server --help grouped, with examples", async () => {
  const device = await kcoral(["server", "--device", "tpu"]);
  assert.equal(device.code, 2);
  assert.match(
    device.stderr,
    /kcoral server: error: argument --device: invalid choice: 'tpu' \(choose from 'gpu', 'cpu'\)\n$/,
  );
  const missing = await kcoral(["server", "--port"]);
  assert.match(missing.stderr, /kcoral server: error: argument --port: expected one argument\n$/);

  const help = (await kcoral(["server", "--help"])).stdout;
  for (const title of ["where it listens:", "who may use it", "GPUs and workers:", "logs ("]) {
    assert.ok(help.includes(`\n${title}`), title);
  }
  assert.match(help, /\nexamples:\n {2}# try it on a laptop\n {2}kcoral server --device cpu/);
  // Every option of the usage line is described exactly once.
  const usage = help.slice(0, help.indexOf("\n\n"));
  for (const flag of new Set(usage.match(/--[a-z][a-z-]*/g))) {
    const described = help.split("\n").filter((line) =>
      new RegExp(`^ {2}${flag}(?= |$)`).test(line)
    );
    assert.equal(described.length, 1, `${flag}: ${described.length}`);
  }
  for (const command of [["router", "--help"], ["health", "--help"], ["mcp", "--help"]]) {
    assert.match((await kcoral(command)).stdout, /\nexamples:\n/, command[0]);
  }
});

Deno.test("cli voice: a self-signed CA:TRUE certificate is named, with the openssl fix", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-catrue-" });
  try {
    // The common one-liner: OpenSSL marks such a certificate CA:TRUE.
    const made = await new Deno.Command("openssl", {
      args: [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        `${dir}/key.pem`,
        "-out",
        `${dir}/cert.pem`,
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
      ],
      stdout: "null",
      stderr: "null",
    }).output();
    assert.ok(made.success);
    const cert = await Deno.readTextFile(`${dir}/cert.pem`);
    const key = await Deno.readTextFile(`${dir}/key.pem`);
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, cert, key, onListen() {} },
      () => new Response("{}"),
    );
    const url = `https://127.0.0.1:${server.addr.port}`;
    const result = await kcoral(["health", "--url", url, "--ca-file", `${dir}/cert.pem`]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /CA:TRUE.*CaUsedAsEndEntity.*basicConstraints=critical,CA:FALSE/s);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
