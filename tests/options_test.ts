/**
 * The options-table mechanism (options/) on tables other than the server's: `kcoral
 * router`'s options and the node supervisor options of `kcoral server` (seed 003), declared the
 * same way as the server's, plus table mistakes and the text, schema and help pieces.
 */
import assert from "node:assert/strict";
import { serverConfigOptions, serverListenOptions } from "../server/config_options.ts";
import {
  checkCommandLineValues,
  CommandLineError,
  commandLineHelp,
  parseCommandLine,
} from "../options/command.ts";
import { describeOption, optionDefaultText } from "../options/help.ts";
import { assertOptionTable, optionTableSchema } from "../options/schema.ts";
import type { OptionTable, OptionTableValues } from "../options/spec.ts";
import { OptionTextError, readOptionText } from "../options/text.ts";

/** `kcoral router` (seed 003, "Router options"). */
const routerOptions = {
  host: {
    flag: "--host",
    type: "string",
    default: "127.0.0.1",
    placeholder: "host",
    help: "Router listen address",
  },
  port: {
    flag: "--port",
    type: "int",
    min: 1,
    max: 65535,
    default: 9000,
    placeholder: "port",
    help: "Router listen port",
  },
  statusCheckIntervalSeconds: {
    flag: "--status-check-interval-seconds",
    type: "number",
    above: 0,
    default: 1,
    placeholder: "s",
    help: "interval for checking status freshness",
  },
  maxStatusAgeSeconds: {
    flag: "--max-status-age-seconds",
    type: "number",
    above: 0,
    default: 5,
    placeholder: "s",
    help: "maximum age of a node health report",
  },
  unhealthyThreshold: {
    flag: "--unhealthy-threshold",
    type: "int",
    min: 1,
    default: 3,
    placeholder: "n",
    help: "failed observations before removing a ready node",
  },
  recoveryThreshold: {
    flag: "--recovery-threshold",
    type: "int",
    min: 1,
    default: 2,
    placeholder: "n",
    help: "successful observations before a failed node returns",
  },
  queueWaitTimeoutSeconds: {
    flag: "--queue-wait-timeout-seconds",
    type: "number",
    above: 0,
    default: 1800,
    placeholder: "s",
    help: "maximum wait for capacity",
  },
  maxQueuedRequests: {
    flag: "--max-queued-requests",
    type: "int",
    min: 0,
    default: 1024,
    placeholder: "n",
    help: "bound on requests waiting for capacity",
  },
  nodeRetentionSeconds: {
    flag: "--node-retention-seconds",
    type: "number",
    min: 0,
    default: 600,
    placeholder: "s",
    help: "retention of disconnected, unused node records",
  },
  maxRequestBytes: {
    flag: "--max-request-bytes",
    type: "int",
    unit: "bytes",
    above: 0,
    default: 268435456,
    placeholder: "n",
    help: "maximum accepted request body size",
  },
  nodeToken: {
    flag: "--node-token",
    env: "KCORAL_NODE_TOKEN",
    type: "string",
    nullable: true,
    emptyIsNull: true,
    default: null,
    placeholder: "token",
    help: "authenticate node connections",
  },
} as const satisfies OptionTable;

const ROUTER = { name: "kcoral router", description: "Route requests across compute nodes." };

/** The hidden supervisor options of `kcoral server` (seed 003): they require --router. */
const supervisorOption = (flag: `--${string}`, type: "int" | "number", value: number) =>
  ({
    flag,
    type,
    above: 0,
    default: value,
    hidden: true,
    requires: "routerEndpoint",
    placeholder: "s",
    help: flag,
  }) as const;

/** Node connection and supervisor options of `kcoral server` (seed 003). */
const nodeOptions = {
  routerEndpoint: {
    flag: "--router",
    env: "KCORAL_ROUTER_ENDPOINT",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "url",
    help: "Router HTTP(S) origin",
  },
  nodeId: {
    flag: "--node-id",
    env: "KCORAL_NODE_ID",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "id",
    help: "stable identifier for this node",
  },
  nodeToken: routerOptions.nodeToken,
  healthIntervalSeconds: supervisorOption("--health-interval-seconds", "number", 2),
  healthTimeoutSeconds: supervisorOption("--health-timeout-seconds", "number", 1),
  failureThreshold: supervisorOption("--failure-threshold", "int", 3),
  startupGraceSeconds: supervisorOption("--startup-grace-seconds", "number", 30),
  stableResetSeconds: supervisorOption("--stable-reset-seconds", "number", 60),
  terminationGraceSeconds: supervisorOption("--termination-grace-seconds", "number", 5),
  restartMinDelaySeconds: supervisorOption("--restart-min-delay-seconds", "number", 1),
  restartMaxDelaySeconds: supervisorOption("--restart-max-delay-seconds", "number", 30),
  restartJitter: {
    flag: "--restart-jitter",
    type: "number",
    min: 0,
    max: 0.5,
    default: 0.2,
    hidden: true,
    requires: "routerEndpoint",
    placeholder: "fraction",
    help: "random variation in restart delay",
  },
} as const satisfies OptionTable;

/** `kcoral server` with the node options: three tables composed into one command line. */
const nodeServerOptions = { ...serverListenOptions, ...nodeOptions, ...serverConfigOptions };
const SERVER = { name: "kcoral server", description: "Start a KCoral server." };

function parsed<T extends OptionTable>(
  argv: string[],
  table: T,
  env: Record<string, string> = {},
  spec = ROUTER,
) {
  const result = parseCommandLine(argv, table, spec, env);
  assert.equal(result.kind, "values");
  return result as Exclude<typeof result, { kind: "help" }>;
}

function failure(run: () => unknown): [number, string] {
  try {
    run();
  } catch (error) {
    assert.ok(error instanceof CommandLineError, String(error));
    return [error.exitCode, error.message];
  }
  assert.fail("expected a CommandLineError");
}

Deno.test("options: a router table gives the seed's defaults, help, variables and types", () => {
  const schema = optionTableSchema(routerOptions);
  const values: OptionTableValues<typeof routerOptions> = schema.defaults({});
  assert.deepEqual(values, {
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
    nodeToken: null,
  });
  const help = commandLineHelp(routerOptions, ROUTER, {}).replace(/\n {20,}/g, " ");
  assert.ok(help.startsWith("usage: kcoral router [-h] [--host HOST]"));
  for (const spec of Object.values(routerOptions)) {
    const line = help.split("\n").find((l) => l.trim().startsWith(`${spec.flag} `));
    assert.ok(line?.includes(describeOption(spec, {})), spec.flag);
  }
  assert.ok(help.includes("(default 268435456 = 256 MiB)"));
  assert.ok(help.includes("authenticate node connections [env: KCORAL_NODE_TOKEN]"));

  const argv = ["--port", "9001", "--max-queued-requests=20", "--node-token", "flag-token"];
  const given = parsed(argv, routerOptions, { KCORAL_NODE_TOKEN: "env-token" });
  assert.deepEqual(given.values, { port: 9001, maxQueuedRequests: 20, nodeToken: "flag-token" });
  assert.deepEqual(given.sources, { port: "flag", maxQueuedRequests: "flag", nodeToken: "flag" });
  const fromEnv = parsed([], routerOptions, { KCORAL_NODE_TOKEN: "env-token" });
  assert.deepEqual(fromEnv.values, { nodeToken: "env-token" });
  assert.deepEqual(fromEnv.sources, { nodeToken: "env" });
  const checked = checkCommandLineValues(schema, given.values);
  const port: number = checked.port;
  const token: string | null = checked.nodeToken;
  assert.equal(port, 9001);
  assert.equal(token, "flag-token");
  assert.equal(checked.statusCheckIntervalSeconds, 1);

  assert.deepEqual(
    failure(() =>
      checkCommandLineValues(schema, parsed(["--unhealthy-threshold", "0"], routerOptions).values)
    ),
    [1, "--unhealthy-threshold must be at least 1"],
  );
  assert.deepEqual(failure(() => parseCommandLine(["--port", "x"], routerOptions, ROUTER, {})), [
    2,
    "kcoral router: error: argument --port: invalid int value: 'x'",
  ]);
});

Deno.test("options: hidden supervisor options require --router and stay out of help", () => {
  const help = commandLineHelp(nodeServerOptions, SERVER, { HOME: "/h" }).replace(/\n {24}/g, " ");
  assert.ok(help.includes("--router URL"));
  assert.ok(help.includes("[env: KCORAL_ROUTER_ENDPOINT]"));
  assert.ok(help.includes("--node-id ID"));
  for (const spec of Object.values(nodeOptions)) {
    assert.equal(help.includes(`${spec.flag} `), !("hidden" in spec), spec.flag);
  }
  for (const flag of ["--health-interval-seconds=2", "--restart-jitter=0.2"]) {
    assert.deepEqual(failure(() => parseCommandLine([flag], nodeServerOptions, SERVER, {})), [
      2,
      `kcoral server: error: ${flag.split("=")[0]} requires --router`,
    ]);
  }
  // The router may come from its variable; only explicit supervisor flags have source "flag"
  // (the ones a supervisor forwards).
  const routed = parsed(
    ["--node-id=cpu-a", "--failure-threshold=5", "--restart-min-delay-seconds=2.5"],
    nodeServerOptions,
    { KCORAL_ROUTER_ENDPOINT: "http://127.0.0.1:9000", HOME: "/h" },
    SERVER,
  );
  const forwarded = Object.entries(routed.sources)
    .filter(([field, source]) =>
      source === "flag" && (nodeOptions as OptionTable)[field]?.hidden === true
    )
    .map(([field]) => field);
  assert.deepEqual(forwarded, ["failureThreshold", "restartMinDelaySeconds"]);
  assert.equal(routed.values.routerEndpoint, "http://127.0.0.1:9000");
  assert.equal(routed.sources.routerEndpoint, "env");
  assert.equal(routed.values.restartMinDelaySeconds, 2.5);

  const nodeSchema = optionTableSchema(nodeOptions);
  const jitter = parsed(["--router", "u", "--restart-jitter", "0.6"], nodeOptions);
  assert.deepEqual(failure(() => checkCommandLineValues(nodeSchema, jitter.values)), [
    1,
    "--restart-jitter must be between 0 and 0.5",
  ]);
  const zero = parsed(["--router", "u", "--restart-jitter", "0"], nodeOptions);
  assert.equal(checkCommandLineValues(nodeSchema, zero.values).restartJitter, 0);
});

Deno.test("options: a table that cannot work is refused when it is used", () => {
  const refused = (table: OptionTable, message: RegExp) => {
    assert.throws(() => assertOptionTable(table), (error: unknown) => {
      assert.ok(error instanceof TypeError);
      assert.match(error.message, message);
      return true;
    });
    assert.throws(() => optionTableSchema(table), TypeError);
    assert.throws(() => commandLineHelp(table, ROUTER, {}), TypeError);
  };
  refused(
    { n: { flag: "--n", type: "int", min: 1, default: 0, help: "" } },
    /--n.*default 0 .*must be at least 1/,
  );
  refused(
    { d: { flag: "--d", type: "choice", choices: ["a", "b"], default: "c", help: "" } },
    /--d.*default "c"/,
  );
  refused({
    a: { flag: "--a", type: "int", default: 0, help: "" },
    b: { flag: "--a", type: "int", default: 0, help: "" },
  }, /flag used twice/);
  refused(
    { a: { flag: "--a", type: "int", default: 0, requires: "nothing", help: "" } },
    /requires unknown field nothing/,
  );
  refused(
    { s: { flag: "--s", type: "string", emptyIsNull: true, default: "x", help: "" } },
    /emptyIsNull needs nullable/,
  );
  refused(
    { b: { flag: "--b", type: "boolean", env: "B", default: false, help: "" } },
    /reads no environment variable/,
  );
});

Deno.test("options: text, schema and help pieces", () => {
  assert.equal(readOptionText({ type: "int" }, "+12"), 12);
  assert.equal(readOptionText({ type: "number" }, "1e2"), 100);
  assert.equal(readOptionText({ type: "choice", choices: ["a", "b"] }, "b"), "b");
  assert.deepEqual(
    readOptionText({ type: "list", items: { type: "number" }, separator: ":" }, "1:2.5"),
    [
      1,
      2.5,
    ],
  );
  for (
    const [spec, text, message] of [
      [{ type: "int" }, "1.5", "invalid int value: '1.5'"],
      [{ type: "number" }, "", "invalid float value: ''"],
      [{ type: "choice", choices: ["a", "b"] }, "c", "invalid choice: 'c' (choose from a, b)"],
      [
        { type: "list", items: { type: "int", min: 0 }, separator: "," },
        "1,-1",
        "invalid int list: '1,-1'",
      ],
    ] as const
  ) {
    assert.throws(() => readOptionText(spec, text), new OptionTextError(message));
  }

  const schema = optionTableSchema(routerOptions);
  const checked = schema.check({ port: 0, maxQueuedRequests: -1 } as never);
  assert.equal(checked.ok, false);
  assert.deepEqual(!checked.ok && checked.problems.map((p) => [p.path, p.flag, p.message]), [
    ["port", "--port", "must be between 1 and 65535"],
    ["maxQueuedRequests", "--max-queued-requests", "must be non-negative"],
  ]);
  const unknown = schema.check({ bogus: 1 } as never);
  assert.deepEqual(!unknown.ok && unknown.problems[0], {
    path: "",
    flag: undefined,
    message: 'Unrecognized key: "bogus"',
    rule: false,
  });
  assert.equal(optionDefaultText(routerOptions.nodeToken, {}), undefined);
  assert.equal(optionDefaultText(serverConfigOptions.gpus, {}), "0");
  assert.equal(
    optionDefaultText(serverConfigOptions.diskCacheDir, { XDG_CACHE_HOME: "/x" }),
    "/x/kcoral/files",
  );
});
