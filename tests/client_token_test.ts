/**
 * Client tokens (issue 22, item 1): every refusal (no token, a wrong one, a malformed header, a
 * token in the query string), what stays open, `--protect-health`, the token file and its
 * reload (SIGHUP), the command lines, the clients (`Client`, `kcoral health`), and a routed
 * deployment where the Router checks the token, the node never sees it, and the node's child
 * server never has it on its command line. No token may appear in events, logs or messages.
 */
import assert from "node:assert/strict";
import { Client, KCoralError, Program } from "../mod.ts";
import { ClientTokens, tokensEqual, UNAUTHORIZED_MESSAGES } from "../http/client_tokens.ts";
import { checkAccessConfig } from "../http/access_options.ts";
import { DROPPED_REQUEST_HEADERS, forwardedHeaders } from "../router/headers.ts";
import { parseServerArgs, ServerArgsError } from "../cli/server.ts";
import { parseRouterCommandLine } from "../router/options.ts";
import { fetchHealth } from "../cli/health.ts";
import { callProgram, postProgram, startServer } from "./_server.ts";
import { KcoralProcess, startNode, startRouter, waitForCapacity, waitUntil } from "./_router.ts";

const ALPHA = "alpha-Token_1";
const BETA = "beta/Token+2==";

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

async function expect401(response: Response, message: string): Promise<void> {
  assert.equal(response.status, 401);
  assert.match(response.headers.get("www-authenticate") ?? "", /^Bearer realm="kcoral"/);
  const body = await response.json();
  assert.equal(body.status, "ERROR");
  assert.equal(body.request_id, response.headers.get("x-request-id"));
  assert.deepEqual(body.error, { kind: "unauthorized", message });
}

Deno.test("tokens compare equal only when equal, whatever the lengths", () => {
  assert.ok(tokensEqual(ALPHA, ALPHA));
  for (const other of ["", "a", ALPHA.slice(0, -1), ALPHA + "x", ALPHA.toUpperCase()]) {
    assert.ok(!tokensEqual(other, ALPHA), other);
  }
});

Deno.test("a server with client tokens refuses every request without an accepted one", async () => {
  const tokens = new ClientTokens({ tokens: [ALPHA, BETA] });
  const server = await startServer({}, { clientTokens: tokens });
  try {
    const program = callProgram("def f(x):\n    return x + 1\n", "f", [41]);
    // Missing, wrong, malformed, and a token in the query string (ignored: still missing).
    const missing = await postProgram(server.url, program);
    assert.equal(missing.status, 401);
    assert.deepEqual(missing.json.error, {
      kind: "unauthorized",
      message: UNAUTHORIZED_MESSAGES.missing,
    });
    assert.equal((await postProgram(server.url, program, { headers: bearer("nope") })).status, 401);
    await expect401(
      await fetch(`${server.url}/execute`, { method: "POST", headers: bearer("nope") }),
      UNAUTHORIZED_MESSAGES.invalid,
    );
    await expect401(
      await fetch(`${server.url}/execute`, {
        method: "POST",
        headers: { authorization: `Basic ${btoa(`user:${ALPHA}`)}` },
      }),
      UNAUTHORIZED_MESSAGES.malformed,
    );
    await expect401(
      await fetch(`${server.url}/execute?token=${ALPHA}&access_token=${ALPHA}`, { method: "POST" }),
      UNAUTHORIZED_MESSAGES.missing,
    );
    for (const path of ["/metrics", "/status", "/status/data"]) {
      await expect401(await fetch(server.url + path), UNAUTHORIZED_MESSAGES.missing);
      await expect401(
        await fetch(`${server.url}${path}?token=${ALPHA}`),
        UNAUTHORIZED_MESSAGES.missing,
      );
      const ok = await fetch(server.url + path, { headers: bearer(BETA) });
      assert.equal(ok.status, 200, path);
      await ok.body?.cancel();
    }
    // HEAD of a guarded route is guarded too; /health and the loopback route stay open.
    assert.equal((await fetch(`${server.url}/metrics`, { method: "HEAD" })).status, 401);
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
    assert.equal((await health.json()).status, "ok");
    const internal = await fetch(`${server.url}/internal/worker-status`);
    assert.equal(internal.status, 200);
    await internal.body?.cancel();
    // Either token runs a program; a lower-case scheme is accepted as RFC 7235 says.
    const ran = await postProgram(server.url, program, {
      headers: { authorization: `bearer ${ALPHA}` },
    });
    assert.equal(ran.status, 200);
    // The TS client: with the token, and without.
    await using client = new Client(server.url, { token: BETA });
    const p = new Program();
    const mod = p.upload({ kind: "module", source: "def f(x):\n    return x * 2\n" });
    p.return_({
      key: "y",
      value: p.run({ fn: p.getFunction({ module: mod, name: "f" }), args: [21] }),
    });
    assert.equal((await client.execute(p)).get("y"), 42);
    await using anonymous = new Client(server.url);
    const refused = await anonymous.execute(p).then(() => null, (error) => error);
    assert.ok(refused instanceof KCoralError, String(refused));
    assert.match(refused.message, /401/);
    assert.match(refused.message, /missing bearer token/);
    await using wrong = new Client(server.url, { token: "not-it", transport: "fetch" });
    const wrongly = await wrong.execute(p).then(() => null, (error) => error);
    assert.ok(wrongly instanceof KCoralError && /invalid bearer token/.test(wrongly.message));
    // Each refusal is an event without the token; no event carries a token.
    const refusals = server.events.filter((e) => e.event === "client_unauthorized");
    assert.ok(refusals.length >= 10, String(refusals.length));
    assert.deepEqual(
      new Set(refusals.map((e) => e.reason)),
      new Set(["missing", "invalid", "malformed"]),
    );
    const logged = JSON.stringify(server.events);
    assert.ok(!logged.includes(ALPHA) && !logged.includes(BETA) && !logged.includes("not-it"));
  } finally {
    await server.stop();
  }
});

Deno.test("--protect-health guards /health; kcoral health sends KCORAL_TOKEN", async () => {
  const tokens = new ClientTokens({ tokens: [ALPHA], protectHealth: true });
  const server = await startServer({}, { clientTokens: tokens });
  try {
    await expect401(await fetch(`${server.url}/health`), UNAUTHORIZED_MESSAGES.missing);
    await expect401(
      await fetch(`${server.url}/health?token=${ALPHA}`),
      UNAUTHORIZED_MESSAGES.missing,
    );
    const answer = await fetchHealth(server.url, 10_000, { token: ALPHA });
    assert.equal(answer.body.status, "ok");
    const refused = await fetchHealth(server.url, 10_000).then(() => "", (e) => e.message);
    assert.match(
      refused,
      /refused the request \(HTTP 401: missing bearer token.*give a client token/,
    );
    const wrong = await fetchHealth(server.url, 10_000, { token: "nope" }).then(
      () => "",
      (e) => e.message,
    );
    assert.match(wrong, /HTTP 401: invalid bearer token.*the token given is not accepted/);
    await using client = new Client(server.url, { token: ALPHA });
    assert.equal((await client.health()).status, "ok");
    // The command itself, with the token from the environment.
    const run = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "cli.ts", "health", "--url", server.url, "--json"],
      env: { KCORAL_TOKEN: ALPHA, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(run.code, 0, new TextDecoder().decode(run.stderr));
    assert.equal(JSON.parse(new TextDecoder().decode(run.stdout)).status, "ok");
  } finally {
    await server.stop();
  }
});

Deno.test("a token file is read again on reload; a failed reload keeps the old set", async () => {
  const file = await Deno.makeTempFile();
  try {
    await Deno.writeTextFile(file, `# team tokens\n${ALPHA}\n\n${BETA}  # ci\n`);
    const tokens = new ClientTokens({ file });
    const asks = (token: string) =>
      tokens.check(new Request("http://x/execute", { headers: bearer(token) }));
    assert.equal(tokens.count, 2);
    assert.equal(asks(ALPHA), null);
    await Deno.writeTextFile(file, "gamma\n");
    assert.deepEqual(tokens.reload(), { ok: true, count: 1 });
    assert.equal(asks(ALPHA), "invalid");
    assert.equal(asks("gamma"), null);
    // A broken line: refused with the line number, never the text; "gamma" stays.
    await Deno.writeTextFile(file, "delta\nbad token here\n");
    const failed = tokens.reload();
    assert.ok(!failed.ok);
    assert.equal(
      failed.error,
      `client token file ${file}, line 2: a token must be letters, digits and '-._~+/' (optionally ending in '='), with no spaces or commas`,
    );
    assert.equal(asks("gamma"), null);
    assert.equal(asks("delta"), "invalid");
    await Deno.writeTextFile(file, "# nobody\n");
    assert.deepEqual(tokens.reload(), {
      ok: false,
      error: `the client token file ${file} holds no token`,
    });
    await Deno.remove(file);
    const gone = tokens.reload();
    assert.ok(!gone.ok && gone.error.startsWith(`cannot read the client token file ${file}:`));
    assert.equal(asks("gamma"), null);
  } finally {
    await Deno.remove(file).catch(() => {});
  }
});

Deno.test("command lines: tokens split on commas, checked without echoing them", () => {
  const args = parseServerArgs(
    ["--client-token", `${ALPHA},${BETA}`, "--protect-health", "--device", "cpu"],
    { HOME: "/home/u" },
  );
  assert.deepEqual(args.access.clientTokens, [ALPHA, BETA]);
  assert.ok(args.access.protectHealth);
  assert.ok(!JSON.stringify(args.config).includes(ALPHA), "tokens stay out of the config");
  const fromEnv = parseServerArgs([], { HOME: "/h", KCORAL_CLIENT_TOKEN: ALPHA });
  assert.deepEqual(fromEnv.access.clientTokens, [ALPHA]);
  assert.deepEqual(
    parseServerArgs([], { HOME: "/h", KCORAL_CLIENT_TOKEN: "" }).access.clientTokens,
    [],
  );
  const invalid = () => parseServerArgs(["--client-token", "sec ret"], { HOME: "/h" });
  assert.throws(invalid, (error: ServerArgsError) => {
    assert.equal(error.exitCode, 1);
    assert.ok(error.message.startsWith("--client-token: a token must be letters"));
    assert.ok(!error.message.includes("sec ret"));
    return true;
  });
  assert.throws(
    () => parseServerArgs(["--protect-health"], { HOME: "/h" }),
    new ServerArgsError("--protect-health requires --client-token or --client-token-file", 1),
  );
  assert.throws(
    () => checkAccessConfig({ tlsKey: "key.pem" }),
    new TypeError("--tls-key requires --tls-cert"),
  );
  const routed = parseRouterCommandLine(["--client-token-file", "/etc/kcoral/tokens"], {});
  assert.equal(routed.access.clientTokenFile, "/etc/kcoral/tokens");
  assert.ok(!("clientTokenFile" in routed.config));
});

Deno.test("the Router never forwards a client's Authorization to a node", () => {
  const headers = new Headers({ ...bearer(ALPHA), "content-type": "multipart/form-data; b=1" });
  const forwarded = forwardedHeaders(headers, DROPPED_REQUEST_HEADERS);
  assert.deepEqual(forwarded, [["content-type", "multipart/form-data; b=1"]]);
});

/** The command line of every live process whose parent is `pid`, and theirs, recursively. */
function descendantCommandLines(pid: number): string[] {
  const lines: string[] = [];
  const children = new Map<number, number[]>();
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(parent, [...(children.get(parent) ?? []), Number(entry.name)]);
    } catch {
      // gone meanwhile
    }
  }
  const walk = (p: number) => {
    for (const child of children.get(p) ?? []) {
      try {
        lines.push(Deno.readTextFileSync(`/proc/${child}/cmdline`).replaceAll("\0", " "));
      } catch {
        // gone meanwhile
      }
      walk(child);
    }
  };
  walk(pid);
  return lines;
}

Deno.test({
  name: "routed: the Router checks client tokens, reloads its file on SIGHUP; nodes never see them",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const file = await Deno.makeTempFile();
    await Deno.writeTextFile(file, `${ALPHA}\n`);
    const router = await startRouter(["--client-token-file", file, "--node-token", "node-secret"]);
    // The node protects its own routes with a token given as a flag: its supervisor hands it to
    // the child server in the environment, never on the command line.
    const node = await startNode(router.url, "cpu-a", {
      extra: ["--client-token", BETA],
      env: { KCORAL_NODE_TOKEN: "node-secret" },
    });
    try {
      await waitForCapacity(router.url, 1);
      const p = callProgram("def f(x):\n    return x + 1\n", "f", [1]);
      assert.equal((await postProgram(router.url, p)).status, 401);
      assert.equal((await postProgram(router.url, p, { headers: bearer(BETA) })).status, 401);
      const ok = await postProgram(router.url, p, { headers: bearer(ALPHA) });
      assert.equal(ok.status, 200, JSON.stringify(ok.json));
      // The node's server is guarded by its own token (direct clients), and its child has no
      // token on any command line.
      const direct = `http://127.0.0.1:${node.port}`;
      assert.equal((await postProgram(direct, p)).status, 401);
      assert.equal((await postProgram(direct, p, { headers: bearer(BETA) })).status, 200);
      const commandLines = descendantCommandLines(node.process.child.pid);
      assert.ok(commandLines.some((line) => / server /.test(line)), commandLines.join("\n"));
      for (const line of [...commandLines]) {
        assert.ok(!line.includes(BETA) && !line.includes("node-secret"), line);
      }
      // SIGHUP: the Router reads the file again; a broken file keeps the old set.
      await Deno.writeTextFile(file, `${BETA}\n`);
      router.process.kill("SIGHUP");
      await router.process.waitForLine(/client tokens reloaded from .*: 1 accepted/);
      assert.equal((await postProgram(router.url, p, { headers: bearer(ALPHA) })).status, 401);
      assert.equal((await postProgram(router.url, p, { headers: bearer(BETA) })).status, 200);
      await Deno.writeTextFile(file, "not a token\n");
      router.process.kill("SIGHUP");
      await router.process.waitForLine(/client tokens not reloaded \(the previous ones stay\)/);
      assert.equal((await postProgram(router.url, p, { headers: bearer(BETA) })).status, 200);
      // The node's events: requests ran there without any client token in them.
      await waitUntil(
        "node events",
        () => node.events().some((e) => e.event === "request_finished"),
      );
      const everything = JSON.stringify(node.events()) + node.process.lines.join("\n") +
        router.process.lines.join("\n");
      for (const secret of [ALPHA, BETA, "node-secret"]) {
        assert.ok(!everything.includes(secret), `${secret} was logged`);
      }
      assert.ok(router.process.lines.some((l) => /client_unauthorized/.test(l)));
    } finally {
      await node.stop();
      await router.stop();
      await Deno.remove(file).catch(() => {});
    }
  },
});

Deno.test("kcoral router refuses an unreadable token file at start, naming it", async () => {
  const process = new KcoralProcess([
    "router",
    "--port",
    "9",
    "--client-token-file",
    "/nonexistent/tokens",
  ]);
  const status = await process.status;
  assert.equal(status.code, 1);
  assert.ok(
    process.lines.some((l) =>
      l.startsWith("kcoral router: cannot read the client token file /nonexistent/tokens:")
    ),
    process.lines.join("\n"),
  );
});
