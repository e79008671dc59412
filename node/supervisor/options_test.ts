/**
 * The node options of `kcoral server` (node/supervisor/options.ts, seed 003): defaults,
 * environment variables and their precedence, hidden supervisor options that require
 * `--router`, the validation of every value (positive, non-negative, ranges, NaN, min ≤ max, the
 * Router origin, the node id, the token), and what the supervisor and its child get. Composed
 * with the server's own tables as `kcoral server` composes them.
 */
import assert from "node:assert/strict";
import { resolveProbeHost } from "./probe.ts";
import { serverConfigOptions, serverListenOptions } from "../../server/config_options.ts";
import { CommandLineError, commandLineHelp, parseCommandLine } from "../../options/command.ts";
import {
  checkNodeCommandLine,
  checkNodeConfig,
  childServerArgs,
  type NodeConfig,
  nodeOptionRules,
  nodeOptions,
  routerEndpointProblem,
  supervisorOptionsFrom,
} from "./options.ts";

const SERVER = { name: "kcoral server", description: "Start a KCoral server." };
const table = { ...serverListenOptions, ...nodeOptions, ...serverConfigOptions };

/** Parses a `kcoral server` command line and checks its node fields. */
function node(argv: string[], env: Record<string, string> = {}): NodeConfig {
  const parsed = parseCommandLine(argv, table, SERVER, { HOME: "/h", ...env });
  assert.equal(parsed.kind, "values");
  if (parsed.kind !== "values") throw new Error();
  return checkNodeCommandLine(parsed);
}

/** The exit status and message a command line fails with. */
function failure(argv: string[], env: Record<string, string> = {}): [number, string] {
  try {
    node(argv, env);
  } catch (error) {
    assert.ok(error instanceof CommandLineError, String(error));
    return [error.exitCode, error.message];
  }
  assert.fail(`accepted: ${argv.join(" ")}`);
}

const ROUTED = ["--router", "http://127.0.0.1:9000", "--node-id", "gpu-a"];

Deno.test("node options: defaults, standalone and routed", () => {
  assert.deepEqual(node([]), {
    routerEndpoint: null,
    nodeId: null,
    nodeToken: null,
    caFile: null,
    healthIntervalSeconds: 2,
    healthTimeoutSeconds: 1,
    failureThreshold: 3,
    startupGraceSeconds: 30,
    stableResetSeconds: 60,
    terminationGraceSeconds: 5,
    restartMinDelaySeconds: 1,
    restartMaxDelaySeconds: 30,
    restartJitter: 0.2,
  });
  const routed = node(ROUTED);
  assert.equal(routed.routerEndpoint, "http://127.0.0.1:9000");
  assert.equal(routed.nodeId, "gpu-a");
  assert.equal(routed.nodeToken, null);
  // Every advanced option, given explicitly.
  const tuned = node([
    ...ROUTED,
    "--health-interval-seconds=0.5",
    "--health-timeout-seconds",
    "0.25",
    "--failure-threshold=5",
    "--startup-grace-seconds=0",
    "--stable-reset-seconds=0",
    "--termination-grace-seconds=0",
    "--restart-min-delay-seconds=0.1",
    "--restart-max-delay-seconds=0.1",
    "--restart-jitter=0",
  ]);
  assert.deepEqual(
    [
      tuned.healthIntervalSeconds,
      tuned.healthTimeoutSeconds,
      tuned.failureThreshold,
      tuned.startupGraceSeconds,
      tuned.stableResetSeconds,
      tuned.terminationGraceSeconds,
      tuned.restartMinDelaySeconds,
      tuned.restartMaxDelaySeconds,
      tuned.restartJitter,
    ],
    [0.5, 0.25, 5, 0, 0, 0, 0.1, 0.1, 0],
  );
});

Deno.test("node options: help shows the connection options, not the advanced ones", () => {
  const help = commandLineHelp(table, SERVER, { HOME: "/h" }).replace(/\n {20,}/g, " ");
  assert.ok(help.includes("--router URL"));
  assert.ok(help.includes("[env: KCORAL_ROUTER_ENDPOINT]"));
  assert.ok(help.includes("--node-id ID"));
  assert.ok(help.includes("[env: KCORAL_NODE_ID]"));
  assert.ok(help.includes("--node-token TOKEN"));
  assert.ok(help.includes("[env: KCORAL_NODE_TOKEN]"));
  const hidden = Object.values(nodeOptions).filter((spec) => "hidden" in spec && spec.hidden);
  assert.equal(hidden.length, 9);
  for (const spec of hidden) assert.ok(!help.includes(spec.flag), spec.flag);
});

Deno.test("node options: variables fill in, explicit flags win", () => {
  const env = {
    KCORAL_ROUTER_ENDPOINT: "https://router.example",
    KCORAL_NODE_ID: "env-node",
    KCORAL_NODE_TOKEN: "env-token",
  };
  assert.deepEqual(
    (({ routerEndpoint, nodeId, nodeToken }) => ({ routerEndpoint, nodeId, nodeToken }))(
      node([], env),
    ),
    { routerEndpoint: "https://router.example", nodeId: "env-node", nodeToken: "env-token" },
  );
  const flags = node(
    ["--router", "http://10.0.0.1:9000/", "--node-id", "flag-node", "--node-token", "flag-token"],
    env,
  );
  assert.equal(flags.routerEndpoint, "http://10.0.0.1:9000/");
  assert.equal(flags.nodeId, "flag-node");
  assert.equal(flags.nodeToken, "flag-token");
  // The Router from its variable is enough for the advanced options.
  assert.equal(node(["--failure-threshold", "7"], env).failureThreshold, 7);
  // Empty routing variables count as unset; an empty token on a routed node is an error (as
  // at the Router), and unused without one.
  assert.deepEqual(failure(ROUTED, { KCORAL_NODE_TOKEN: "" }), [
    1,
    "KCORAL_NODE_TOKEN must not be empty (unset it for no token)",
  ]);
  assert.equal(node([], { KCORAL_NODE_TOKEN: "" }).routerEndpoint, null);
  assert.equal(node([], { KCORAL_ROUTER_ENDPOINT: "", KCORAL_NODE_ID: "" }).routerEndpoint, null);
});

Deno.test("node options: advanced options require --router; --router and --node-id go together", () => {
  for (const spec of Object.values(nodeOptions)) {
    if (["--router", "--node-id", "--node-token", "--ca-file"].includes(spec.flag)) continue;
    assert.deepEqual(failure([`${spec.flag}=1`]), [
      2,
      `kcoral server: error: ${spec.flag} requires --router`,
    ]);
  }
  // Upstream's message and status, by flag or by variable; a token alone is unused.
  const together = [1, "--router and --node-id must be configured together"];
  assert.deepEqual(failure(["--node-id", "gpu-a"]), together);
  assert.deepEqual(failure([], { KCORAL_NODE_ID: "gpu-a" }), together);
  assert.deepEqual(failure(["--router", "http://127.0.0.1:9000"]), together);
  assert.deepEqual(failure([], { KCORAL_ROUTER_ENDPOINT: "http://127.0.0.1:9000" }), together);
  assert.equal(node(["--node-token", "t"]).routerEndpoint, null);
  assert.equal(node([], { KCORAL_NODE_TOKEN: "t" }).routerEndpoint, null);
});

Deno.test("node options: values are validated", () => {
  const cases: [string[], number, string][] = [
    [["--health-interval-seconds", "0"], 1, "--health-interval-seconds must be positive"],
    [["--health-timeout-seconds", "-1"], 1, "--health-timeout-seconds must be positive"],
    [["--failure-threshold", "0"], 1, "--failure-threshold must be at least 1"],
    [
      ["--failure-threshold", "1.5"],
      2,
      "kcoral server: error: argument --failure-threshold: invalid int value: '1.5'",
    ],
    [["--startup-grace-seconds", "-0.1"], 1, "--startup-grace-seconds must be non-negative"],
    [["--stable-reset-seconds", "-1"], 1, "--stable-reset-seconds must be non-negative"],
    [["--termination-grace-seconds", "-1"], 1, "--termination-grace-seconds must be non-negative"],
    [["--restart-min-delay-seconds", "0"], 1, "--restart-min-delay-seconds must be positive"],
    [["--restart-max-delay-seconds", "0"], 1, "--restart-max-delay-seconds must be positive"],
    [
      ["--restart-min-delay-seconds", "5", "--restart-max-delay-seconds", "2"],
      1,
      "--restart-max-delay-seconds must not be below --restart-min-delay-seconds",
    ],
    [["--restart-jitter", "0.6"], 1, "--restart-jitter must be between 0 and 0.5"],
    [["--restart-jitter", "-0.1"], 1, "--restart-jitter must be between 0 and 0.5"],
    [
      ["--health-interval-seconds", "nan"],
      2,
      "kcoral server: error: argument --health-interval-seconds: invalid float value: 'nan'",
    ],
    [
      ["--restart-jitter", "NaN"],
      2,
      "kcoral server: error: argument --restart-jitter: invalid float value: 'NaN'",
    ],
    [
      ["--stable-reset-seconds", "inf"],
      2,
      "kcoral server: error: argument --stable-reset-seconds: invalid float value: 'inf'",
    ],
    [["--node-token", ""], 1, "--node-token must not be empty"],
    [["--node-token="], 1, "--node-token must not be empty"],
  ];
  for (const [argv, code, message] of cases) {
    assert.deepEqual(failure([...ROUTED, ...argv]), [code, message], argv.join(" "));
  }
  assert.equal(node([...ROUTED, "--restart-jitter", "0.5"]).restartJitter, 0.5);
  assert.equal(node([...ROUTED, "--restart-min-delay-seconds", "30"]).restartMinDelaySeconds, 30);
});

Deno.test("node options: the Router is an http(s) origin; the node id is required and valid", () => {
  for (const good of ["http://127.0.0.1:9000", "https://router.example/", "http://[::1]:9000"]) {
    assert.equal(routerEndpointProblem(good), null, good);
    assert.equal(node(["--router", good, "--node-id", "a"]).routerEndpoint, good);
  }
  const origin = "--router must be an http or https origin (no path, query or fragment)";
  for (
    const bad of [
      "127.0.0.1:9000",
      "ws://127.0.0.1:9000",
      "http://127.0.0.1:9000/api",
      "http://127.0.0.1:9000/?x=1",
      "http://127.0.0.1:9000/?",
      "http://127.0.0.1:9000/#top",
      "http://user:pw@127.0.0.1:9000",
      "not a url",
    ]
  ) {
    assert.notEqual(routerEndpointProblem(bad), null, bad);
    assert.deepEqual(failure(["--router", bad, "--node-id", "a"]), [1, origin], bad);
  }
  for (const bad of ["bad name", "-lead", "x".repeat(65), "gpu/a"]) {
    const [code, message] = failure(["--router", "http://r:9000", "--node-id", bad]);
    assert.equal(code, 1);
    assert.match(message, /^--node-id must be 1-64 letters/);
  }
  assert.equal(node(["--router", "http://r:9000", "--node-id", "gpu-a.1_B"]).nodeId, "gpu-a.1_B");
  assert.equal(node(["--router", "http://r:9000", "--node-id", "x".repeat(64)]).nodeId?.length, 64);
  assert.ok(nodeOptionRules.length >= 4);
});

Deno.test("node options: configuration objects are checked the same way", () => {
  assert.equal(checkNodeConfig({}).routerEndpoint, null);
  assert.throws(
    () =>
      checkNodeConfig({ routerEndpoint: "http://r:9000", nodeId: "a", healthTimeoutSeconds: 0 }),
    new TypeError("--health-timeout-seconds must be positive"),
  );
  assert.throws(
    () => checkNodeConfig({ routerEndpoint: "http://r:9000", nodeId: "a", bogus: 1 } as never),
    TypeError,
  );
});

Deno.test("node options: the supervisor's options and the child's environment", () => {
  const config = node([...ROUTED, "--node-token", "s3cret", "--failure-threshold", "4"]);
  const signal = new AbortController().signal;
  const options = supervisorOptionsFrom(config, {
    host: "::",
    port: 8001,
    child: { command: "/usr/bin/deno", args: ["run", "-A", "cli.ts", "server"], env: { A: "1" } },
    signal,
  });
  assert.equal(options.serverUrl, "http://[::1]:8001/");
  assert.equal(options.nodeId, "gpu-a");
  assert.equal(options.nodeToken, "s3cret");
  assert.equal(options.failureThreshold, 4);
  assert.equal(options.restartJitter, 0.2);
  assert.equal(options.signal, signal);
  assert.deepEqual(options.child, {
    command: "/usr/bin/deno",
    args: ["run", "-A", "cli.ts", "server"],
    env: {
      A: "1",
      KCORAL_NODE_SERVER: "1",
      KCORAL_ROUTER_ENDPOINT: "http://127.0.0.1:9000",
      KCORAL_NODE_ID: "gpu-a",
      KCORAL_NODE_TOKEN: "s3cret",
      KCORAL_SERVER_HOST: "::",
      KCORAL_SERVER_PORT: "8001",
    },
  });
  assert.ok(!options.child.args.join(" ").includes("s3cret"));
  assert.throws(
    () => supervisorOptionsFrom(node([]), { host: "127.0.0.1", port: 8000, child: options.child }),
    TypeError,
  );
});

Deno.test("node options: a host name is probed at the address it resolves to", async () => {
  for (const literal of ["0.0.0.0", "", "::", "[::1]", "10.0.0.5", "fe80::1"]) {
    assert.equal(await resolveProbeHost(literal), literal);
  }
  const local = await resolveProbeHost("localhost");
  assert.ok(local === "127.0.0.1" || local === "::1", local);
  await assert.rejects(resolveProbeHost("no-such-host.invalid"));
  const options = supervisorOptionsFrom(node(ROUTED), {
    host: "gpu-a.example",
    probeHost: "10.0.0.5",
    port: 8000,
    child: { command: "kcoral", args: ["server"], env: {} },
  });
  assert.equal(options.serverUrl, "http://10.0.0.5:8000/");
  assert.equal(options.child.env.KCORAL_SERVER_HOST, "gpu-a.example", "the server binds the name");
});

Deno.test("node options: the child's arguments leave out every node option", () => {
  assert.deepEqual(
    childServerArgs([
      "--router",
      "http://127.0.0.1:9000",
      "--node-id=gpu-a",
      "--node-token",
      "s3cret",
      "--port",
      "8001",
      "--restart-jitter=0",
      "--health-interval-seconds",
      "0.5",
      "--device",
      "cpu",
      "--python=/usr/bin/python3",
    ]),
    ["--port", "8001", "--device", "cpu", "--python=/usr/bin/python3"],
  );
  assert.deepEqual(childServerArgs(["--gpus", "0,1", "--", "--router"]), [
    "--gpus",
    "0,1",
    "--",
    "--router",
  ]);
});

Deno.test("node options: nodeOptions", () => {
  if (nodeOptions.routerEndpoint.env !== "KCORAL_ROUTER_ENDPOINT") throw new Error();
  if (nodeOptions.restartJitter.max !== 0.5 || !nodeOptions.restartJitter.hidden) throw new Error();
});

Deno.test("node options: routerEndpointProblem", () => {
  if (routerEndpointProblem("https://router.example:9000/") !== null) throw new Error();
  if (routerEndpointProblem("http://router.example/api") === null) throw new Error();
  if (routerEndpointProblem("grpc://router.example") === null) throw new Error();
});

Deno.test("node options: nodeOptionRules", () => {
  if (!nodeOptionRules.some((rule) => rule.field === "restartMaxDelaySeconds")) throw new Error();
});

Deno.test("node options: checkNodeConfig", () => {
  const config = checkNodeConfig({ routerEndpoint: "http://127.0.0.1:9000", nodeId: "gpu-a" });
  if (config.healthIntervalSeconds !== 2) throw new Error();
  try {
    checkNodeConfig({ routerEndpoint: "http://127.0.0.1:9000" });
    throw new Error("accepted");
  } catch (error) {
    if (!(error instanceof TypeError) || error.message !== "--node-id is required with --router") {
      throw error;
    }
  }
});

Deno.test("node options: checkNodeCommandLine", () => {
  const config = checkNodeCommandLine({
    values: { routerEndpoint: "http://127.0.0.1:9000", nodeId: "gpu-a", port: 1 },
    sources: { routerEndpoint: "flag", nodeId: "env", port: "flag" },
  });
  if (config.nodeToken !== null || config.failureThreshold !== 3) throw new Error();
});

Deno.test("node options: childServerArgs", () => {
  const args = childServerArgs([
    "--router",
    "http://127.0.0.1:9000",
    "--node-token=s3cret",
    "--port",
    "8001",
    "--failure-threshold",
    "5",
    "--device",
    "cpu",
  ]);
  if (args.join(" ") !== "--port 8001 --device cpu") throw new Error(args.join(" "));
});

Deno.test("node options: supervisorOptionsFrom", () => {
  const config = checkNodeConfig({
    routerEndpoint: "http://127.0.0.1:9000",
    nodeId: "gpu-a",
    nodeToken: "s3cret",
  });
  const options = supervisorOptionsFrom(config, {
    host: "0.0.0.0",
    port: 8000,
    child: { command: "kcoral", args: ["server"], env: {} },
  });
  if (options.serverUrl !== "http://127.0.0.1:8000/") throw new Error();
  if (options.child.env.KCORAL_NODE_TOKEN !== "s3cret" || options.child.args.length !== 1) {
    throw new Error();
  }
});
