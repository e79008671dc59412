/** `kcoral router` options (seed 003, "Router options"; spec router §3–§4 validation). */
import assert from "node:assert/strict";
import { KcoralProcess } from "./_router.ts";
import { CommandLineError } from "../options/command.ts";
import { optionDefaultText } from "../options/help.ts";
import {
  parseRouterArgs,
  registryConfig,
  RouterHelp,
  routerHelpText,
  routerOptions,
} from "../router/options.ts";

/** The exit status and message `run` fails with. */
function failure(run: () => unknown): [number, string] {
  try {
    run();
  } catch (error) {
    assert.ok(error instanceof CommandLineError, String(error));
    return [error.exitCode, error.message];
  }
  assert.fail("expected a CommandLineError");
}

Deno.test("router options: the seed's flags and defaults, nothing more", () => {
  assert.deepEqual(Object.values(routerOptions).map((spec) => spec.flag), [
    "--host",
    "--port",
    "--status-check-interval-seconds",
    "--max-status-age-seconds",
    "--unhealthy-threshold",
    "--recovery-threshold",
    "--queue-wait-timeout-seconds",
    "--max-queued-requests",
    "--node-retention-seconds",
    "--max-request-bytes",
    // Ours, not the seed's: stalled heads, idle connections and bodies that stop arriving are
    // cut, and connections are bounded (issue 44).
    "--header-timeout-seconds",
    "--keep-alive-timeout-seconds",
    "--body-timeout-seconds",
    "--max-connections",
    // Ours, not the seed's: JSON console lines for log shippers.
    "--log-format",
    "--node-token",
  ]);
  assert.deepEqual(parseRouterArgs([], {}), {
    host: "127.0.0.1",
    port: 9000,
    statusCheckIntervalSeconds: 1,
    maxStatusAgeSeconds: 5,
    unhealthyThreshold: 3,
    recoveryThreshold: 2,
    queueWaitTimeoutSeconds: 1800,
    maxQueuedRequests: 1024,
    nodeRetentionSeconds: 600,
    maxRequestBytes: 268435456,
    headerTimeoutSeconds: 10,
    keepAliveTimeoutSeconds: 30,
    bodyTimeoutSeconds: 30,
    maxConnections: 1024,
    logFormat: "text",
    nodeToken: null,
  });
});

Deno.test("router options: --help lists every option with its default", () => {
  for (const argv of [["--help"], ["-h"], ["--port", "1", "--help"]]) {
    assert.throws(() => parseRouterArgs(argv, {}), RouterHelp);
  }
  let text = "";
  try {
    parseRouterArgs(["--help"], {});
  } catch (error) {
    assert.ok(error instanceof RouterHelp);
    text = error.text;
  }
  assert.equal(text, routerHelpText({}));
  assert.ok(text.startsWith("usage: kcoral router [-h] [--version]"));
  const flat = text.replace(/\n {20,}/g, " ");
  for (const spec of Object.values(routerOptions)) {
    const line = flat.split("\n").find((l) => l.trim().startsWith(`${spec.flag} `));
    assert.ok(line, spec.flag);
    const shown = optionDefaultText(spec, {});
    if (shown !== undefined) assert.ok(line.includes(`(default ${shown})`), line);
  }
  assert.ok(flat.includes("(default 268435456 = 256 MiB)"));
  assert.match(flat, /--node-token TOKEN .*no token.*\[env: KCORAL_NODE_TOKEN\]/);
});

Deno.test("router options: the token flag wins over the variable; an empty token is an error", () => {
  const env = { KCORAL_NODE_TOKEN: "env-token" };
  assert.equal(parseRouterArgs(["--node-token", "flag-token"], env).nodeToken, "flag-token");
  assert.equal(parseRouterArgs([], env).nodeToken, "env-token");
  assert.equal(parseRouterArgs([], {}).nodeToken, null);
  // Set but empty (spec router §1.2): refused, never read as "no token".
  assert.deepEqual(failure(() => parseRouterArgs([], { KCORAL_NODE_TOKEN: "" })), [
    1,
    "KCORAL_NODE_TOKEN must not be empty (unset it for no token)",
  ]);
  // The flag wins over an empty variable.
  assert.equal(
    parseRouterArgs(["--node-token", "flag-token"], { KCORAL_NODE_TOKEN: "" }).nodeToken,
    "flag-token",
  );
  for (const argv of [["--node-token", ""], ["--node-token="]]) {
    assert.deepEqual(failure(() => parseRouterArgs(argv, env)), [
      1,
      "--node-token must not be empty",
    ]);
  }
  assert.equal(parseRouterArgs(["--node-token=a b"], {}).nodeToken, "a b");
  assert.equal(parseRouterArgs(["--port", "0"], {}).port, 0, "any free port, as upstream's u16");
});

Deno.test("router options: out-of-range settings exit 1 naming the flag", () => {
  const cases: [string[], string][] = [
    [["--port", "-1"], "--port must be between 0 and 65535"],
    [["--port", "65536"], "--port must be between 0 and 65535"],
    [["--status-check-interval-seconds", "0"], "--status-check-interval-seconds must be positive"],
    [["--max-status-age-seconds", "0"], "--max-status-age-seconds must be positive"],
    [["--unhealthy-threshold", "0"], "--unhealthy-threshold must be at least 1"],
    [["--recovery-threshold", "0"], "--recovery-threshold must be at least 1"],
    [["--queue-wait-timeout-seconds", "-1"], "--queue-wait-timeout-seconds must be non-negative"],
    [["--max-queued-requests", "-1"], "--max-queued-requests must be non-negative"],
    [["--max-request-bytes", "0"], "--max-request-bytes must be positive"],
    [
      ["--node-retention-seconds", "5"],
      "--node-retention-seconds must exceed --max-status-age-seconds",
    ],
    [
      ["--max-status-age-seconds", "700"],
      "--node-retention-seconds must exceed --max-status-age-seconds",
    ],
  ];
  for (const [argv, message] of cases) {
    assert.deepEqual(failure(() => parseRouterArgs(argv, {})), [1, message], argv.join(" "));
  }
});

Deno.test("router options: boundary values are accepted", () => {
  const config = parseRouterArgs([
    "--port=65535",
    "--queue-wait-timeout-seconds=0",
    "--max-queued-requests=0",
    "--max-status-age-seconds=0.5",
    "--node-retention-seconds=0.6",
    "--status-check-interval-seconds=0.02",
    "--unhealthy-threshold=1",
    "--recovery-threshold=1",
    "--max-request-bytes=1",
    "--host=0.0.0.0",
  ], {});
  assert.equal(config.port, 65535);
  assert.equal(config.host, "0.0.0.0");
  assert.deepEqual(registryConfig(config), {
    maxStatusAgeMs: 500,
    unhealthyThreshold: 1,
    recoveryThreshold: 1,
    nodeRetentionMs: 600,
    statusCheckIntervalMs: 20,
    maxQueuedRequests: 0,
    queueWaitTimeoutMs: 0,
  });
});

Deno.test("router options: a malformed command line exits 2", () => {
  const cases: [string[], string][] = [
    [["--port", "x"], "kcoral router: error: argument --port: invalid int value: 'x'"],
    [
      ["--unhealthy-threshold", "1.5"],
      "kcoral router: error: argument --unhealthy-threshold: invalid int value: '1.5'",
    ],
    [
      ["--max-status-age-seconds", "soon"],
      "kcoral router: error: argument --max-status-age-seconds: invalid float value: 'soon'",
    ],
    [["--router", "http://x"], "kcoral router: error: unrecognized arguments: --router"],
  ];
  for (const [argv, message] of cases) {
    assert.deepEqual(failure(() => parseRouterArgs(argv, {})), [2, message]);
  }
  const [code] = failure(() => parseRouterArgs(["extra"], {}));
  assert.equal(code, 2);
  const [missing] = failure(() => parseRouterArgs(["--port"], {}));
  assert.equal(missing, 2);
});

Deno.test("router options: only the token is read from the environment", () => {
  const config = parseRouterArgs([], {
    KCORAL_ROUTER_PORT: "1",
    KCORAL_SERVER_PORT: "2",
    KCORAL_NODE_TOKEN: "t",
  });
  assert.equal(config.port, 9000);
  assert.equal(config.nodeToken, "t");
});

Deno.test("kcoral router --port 0 listens on a free port and logs that port", async () => {
  const router = new KcoralProcess(["router", "--port", "0"]);
  try {
    const listening = await router.waitForLine(/KCoral router listening on /);
    const url = listening.match(/listening on (http:\/\/127\.0\.0\.1:(\d+))/);
    assert.ok(url && url[2] !== "0", listening);
    await router.waitForLine(new RegExp(`router_started .*port=${url[2]} `));
    const health = await fetch(`${url[1]}/health`);
    assert.equal(health.status, 503, "no node yet");
    await health.body?.cancel();
  } finally {
    assert.equal((await router.stop()).code, 0);
  }
});
