/**
 * TLS (issue 22, item 2) with certificates made here by `openssl`: a CA, a server certificate
 * it signs (for 127.0.0.1 and localhost), another CA, and an expired certificate. A server and
 * a Router serve HTTPS; the clients trust the CA given to them (`caCerts`, `--ca-file`,
 * `KCORAL_CA_FILE`) and fail clearly on a wrong CA, an expired certificate and a scheme
 * mismatch; a node links to an `https://` Router over `wss://` with its `--ca-file`.
 */
import assert from "node:assert/strict";
import { Client, Program, TransportError } from "../mod.ts";
import { ClientTokens } from "../http/client_tokens.ts";
import { fetchHealth } from "../cli/health.ts";
import { startServer } from "./_server.ts";
import { freePort, KcoralProcess, startNode, waitUntil } from "./_router.ts";
import { makePki } from "./_pki.ts";

/** The files of a small PKI, made once for the whole file. */
const pki = await makePki();
const read = (path: string) => Deno.readTextFileSync(path);
const TOKEN = "tls-Token_1";

function doubling(): Program {
  const p = new Program();
  const mod = p.upload({ kind: "module", source: "def f(x):\n    return x * 2\n" });
  p.return_({
    key: "y",
    value: p.run({ fn: p.getFunction({ module: mod, name: "f" }), args: [21] }),
  });
  return p;
}

async function failure(promise: Promise<unknown>): Promise<Error> {
  return await promise.then(() => assert.fail("accepted"), (error) => error);
}

Deno.test({
  name:
    "https server: the CA given is trusted; a wrong CA, an expired certificate and scheme mismatches fail clearly",
  sanitizeResources: false,
  async fn() {
    const tokens = new ClientTokens({ tokens: [TOKEN] });
    const server = await startServer({}, { clientTokens: tokens }, {
      tls: { cert: read(pki.cert), key: read(pki.key) },
    });
    const expired = await startServer({}, {}, {
      tls: { cert: read(pki.expired), key: read(pki.key) },
    });
    const plain = await startServer();
    try {
      assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
      // Trusted, with the token: a program runs; GETs and POSTs alike.
      await using client = new Client(server.url, { token: TOKEN, caCerts: [read(pki.ca)] });
      assert.equal((await client.health()).status, "ok");
      assert.equal((await client.execute(doubling())).get("y"), 42);
      // Trusted, without the token: 401 over TLS too.
      await using anonymous = new Client(server.url, { caCerts: [read(pki.ca)] });
      assert.match((await failure(anonymous.execute(doubling()))).message, /401.*missing bearer/s);
      // The system's CAs only, or another CA: not trusted.
      for (const caCerts of [[], [read(pki.otherCa)]]) {
        await using untrusting = new Client(server.url, { token: TOKEN, caCerts });
        const error = await failure(untrusting.execute(doubling()));
        assert.ok(error instanceof TransportError, String(error));
        assert.match(
          error.message,
          /the server's TLS certificate is not signed by a trusted authority \(UnknownIssuer\): trust the CA that signed it \(caCerts, --ca-file or KCORAL_CA_FILE\)/,
        );
        assert.ok(!error.message.includes(TOKEN));
      }
      // An expired certificate.
      await using late = new Client(expired.url, { caCerts: [read(pki.ca)] });
      const old = await failure(late.health());
      assert.ok(old instanceof TransportError);
      assert.match(old.message, /the server's TLS certificate has expired \(Expired\)/);
      // https:// to a plain server, http:// to a TLS one.
      await using wrongScheme = new Client(plain.url.replace("http:", "https:"));
      assert.match(
        (await failure(wrongScheme.health())).message,
        /the server did not answer TLS: does it serve plain http:\/\/ rather than https:\/\/\?/,
      );
      await using plainToTls = new Client(server.url.replace("https:", "http:"));
      assert.ok((await failure(plainToTls.health())) instanceof TransportError);
      // kcoral health: --ca-file's text, and the same failures.
      const answer = await fetchHealth(server.url, 10_000, { caCerts: [read(pki.ca)] });
      assert.equal(answer.body.status, "ok");
      assert.match(
        (await failure(fetchHealth(server.url, 10_000, { caCerts: [read(pki.otherCa)] }))).message,
        /^cannot reach https:\/\/127\.0\.0\.1:\d+\/health: the server's TLS certificate is not signed by a trusted authority/,
      );
      assert.match(
        (await failure(fetchHealth(expired.url, 10_000, { caCerts: [read(pki.ca)] }))).message,
        /has expired/,
      );
      const run = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "cli.ts", "health", "--url", server.url],
        env: { KCORAL_CA_FILE: pki.ca, NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(run.code, 0, new TextDecoder().decode(run.stderr));
    } finally {
      await Promise.all([server.stop(), expired.stop(), plain.stop()]);
    }
  },
});

Deno.test("kcoral server names an unreadable certificate or key and exits 1", async () => {
  for (
    const [args, message] of [
      [
        ["--tls-cert", "/nonexistent/cert.pem", "--tls-key", pki.key],
        "cannot read the TLS certificate /nonexistent/cert.pem",
      ],
      [["--tls-cert", pki.cert, "--tls-key", pki.ca.replace("ca.pem", "ext")], "is not PEM"],
      [["--tls-cert", pki.cert], "--tls-cert requires --tls-key"],
    ] as const
  ) {
    const process = new KcoralProcess([
      "server",
      "--device",
      "cpu",
      "--port",
      String(freePort()),
      ...args,
    ]);
    const status = await process.status;
    assert.equal(status.code, 1, process.lines.join("\n"));
    assert.ok(process.lines.some((line) => line.includes(message)), process.lines.join("\n"));
  }
});

Deno.test({
  name:
    "routed over TLS: an https Router with tokens, a node on wss:// with --ca-file; a wrong CA is reported",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const port = freePort();
    const router = new KcoralProcess([
      "router",
      "--port",
      String(port),
      "--status-check-interval-seconds",
      "0.1",
      "--recovery-threshold",
      "1",
      "--tls-cert",
      pki.cert,
      "--tls-key",
      pki.key,
    ], { KCORAL_CLIENT_TOKEN: TOKEN });
    await router.waitForLine(/KCoral router listening on https:\/\/127\.0\.0\.1:/);
    const url = `https://127.0.0.1:${port}`;
    const node = await startNode(url, "tls-a", { extra: ["--ca-file", pki.ca] });
    const stranger = await startNode(url, "tls-b", { env: { KCORAL_CA_FILE: pki.otherCa } });
    try {
      await using client = new Client(url, { token: TOKEN, caCerts: [read(pki.ca)] });
      await waitUntil("the node's slot", async () => {
        const health = await client.health().catch(() => null);
        return health?.load?.request_capacity === 1;
      });
      assert.equal((await client.execute(doubling())).get("y"), 42);
      await using anonymous = new Client(url, { caCerts: [read(pki.ca)] });
      assert.match((await failure(anonymous.execute(doubling()))).message, /401/);
      // The node that does not trust the Router's CA says why, and never joins.
      await stranger.process.waitForLine(
        /control stream ended \(the server's TLS certificate is not signed by a trusted authority/,
      );
      assert.equal((await client.health()).load?.request_capacity, 1);
    } finally {
      await Promise.all([node.stop(), stranger.stop()]);
      await router.stop();
    }
  },
});

Deno.test({
  name: "tls: remove the certificates",
  fn: () => Deno.remove(pki.dir, { recursive: true }),
});
