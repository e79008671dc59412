/**
 * Command-line parsing of `kcoral run` and `kcoral run TOOL`, with upstream KCoral's rules,
 * messages and exit codes (help 0, argument errors 2). Nothing here reads the process
 * environment, prints, or contacts a server: the caller passes the environment in and
 * prints the returned texts.
 *
 * @module
 */

import { isPositional, type OptionSpec, scanOptions } from "./argscan.ts";
import { resolveConnection } from "./connection.ts";
import { parseEnvEntries } from "./environment.ts";
import { relativeParts } from "./paths.ts";
import { pyStrRepr } from "../../protocol/python_repr.ts";
import { isToolName, TOOL_NAMES, type ToolName, TOOLS } from "./tools.ts";
import { dispatcherHelp, dispatcherUsage, toolHelp, toolUsage } from "./usage.ts";
import { validateToolArguments } from "./validators.ts";
import { versionLine } from "../../options/version.ts";

/** Default `--timeout`, in seconds. */
export const DEFAULT_TIMEOUT_SECONDS = 300;
/** Default `--output-limit-bytes` (256 MiB). */
export const DEFAULT_OUTPUT_LIMIT_BYTES = 268435456;

/** A validated `kcoral run TOOL` command line. */
export interface RunArgs {
  /** The tool. */
  tool: ToolName;
  /** Server base URL (`--url`, `http://HOST:PORT`, or `KCORAL_URL`). */
  url: string;
  /** Client token (`--token`, or `KCORAL_TOKEN`); `null`: none. */
  token: string | null;
  /** CA certificate file trusted for `https://` (`--ca-file`, or `KCORAL_CA_FILE`); `null`: none. */
  caFile: string | null;
  /** `--timeout`: positive integer seconds (values beyond 2^53-1 are clamped). */
  timeoutSeconds: number;
  /** `--output-limit-bytes`: positive integer bytes (values beyond 2^53-1 are clamped). */
  outputLimitBytes: number;
  /** `--send` paths as given, in order (checked when packing). */
  send: string[];
  /** Remote environment overrides from `-e/--env`. */
  env: Record<string, string>;
  /** `--fetch` paths, in order (always empty for profilers). */
  fetch: string[];
  /** `--out` as given, when given (not yet checked for existence). */
  out?: string;
  /** Native arguments after the first `--`, unchanged. */
  forwarded: string[];
  /** Lines to print on stderr before running (no trailing newline). */
  warnings: string[];
  /** `-v`/`--verbose`: print the request id and the server's timings on stderr at the end. */
  verbose?: boolean;
}

/** Successful parse of `kcoral run TOOL ...`. */
export interface RunArgsOk extends RunArgs {
  /** Discriminant. */
  kind: "ok";
}

/** A help request: print `text` on stdout and exit 0. */
export interface RunHelp {
  /** Discriminant. */
  kind: "help";
  /** Always 0. */
  exitCode: 0;
  /** The help text, ending with a newline. */
  text: string;
}

/** An argument error: print `warnings`, then `text`, on stderr and exit 2. */
export interface RunArgsError {
  /** Discriminant. */
  kind: "error";
  /** Always 2. */
  exitCode: 2;
  /** The bare message, e.g. `--timeout must be positive`. */
  message: string;
  /** Usage line plus `PROG: error: MESSAGE`, ending with a newline. */
  text: string;
  /** Warnings produced before the error (no trailing newline each). */
  warnings: string[];
}

/** Result of {@linkcode parseRunArgs}. */
export type RunArgsResult = RunArgsOk | RunHelp | RunArgsError;

/** `kcoral run TOOL ...`: run this tool with the remaining arguments. */
export interface RunDispatch {
  /** Discriminant. */
  kind: "tool";
  /** The selected tool. */
  tool: ToolName;
  /** The arguments after the tool name, unchanged. */
  argv: string[];
}

/** Result of {@linkcode parseRunDispatcher}. */
export type RunDispatchResult = RunDispatch | RunHelp | RunArgsError;

/**
 * Parse the arguments after `kcoral run`. Only the first one is examined: a tool name
 * selects the tool (everything after it is left to {@linkcode parseRunArgs}); `-h` or
 * `--help` shows the tool list; nothing, an option, or an unknown name is an error.
 *
 * @example
 * ```ts
 * import { parseRunDispatcher } from "./args.ts";
 * parseRunDispatcher(["python", "--", "-c", "pass"]);
 * // { kind: "tool", tool: "python", argv: ["--", "-c", "pass"] }
 * parseRunDispatcher([]).kind; // "error"
 * ```
 */
export function parseRunDispatcher(argv: readonly string[]): RunDispatchResult {
  const tool = argv[0];
  if (tool === undefined) return _dispatchError("the following arguments are required: tool");
  // Ours (upstream has no --version): the usage line stays upstream's.
  if (tool === "--version") return { kind: "help", exitCode: 0, text: `${versionLine()}\n` };
  const help: OptionSpec = { strings: ["-h", "--help"], dest: "help", action: "help" };
  if (!isPositional(tool, help.strings)) {
    const scanned = scanOptions([help], [tool]);
    if (scanned.kind === "help") return { kind: "help", exitCode: 0, text: dispatcherHelp() };
    if (scanned.kind === "error" && scanned.message.startsWith("argument ")) {
      return _dispatchError(scanned.message);
    }
    // An unknown option is left over; the missing tool is reported first.
    return _dispatchError("the following arguments are required: tool");
  }
  if (!isToolName(tool)) return _invalidTool(tool);
  return { kind: "tool", tool, argv: argv.slice(1) };
}

/**
 * Parse and validate `kcoral run TOOL ARGV...` (`argv` is everything after the tool name).
 *
 * `env` is the local environment, used for `KCORAL_URL` and for `-e NAME` copies. Help
 * (`-h`/`--help` before the first `--`, or anywhere when there is no `--`) never needs a
 * server or `KCORAL_URL`.
 *
 * @example
 * ```ts
 * import { parseRunArgs } from "./args.ts";
 * const result = parseRunArgs("python", ["--port", "9000", "--", "check.py"], {});
 * if (result.kind === "ok") result.url; // "http://127.0.0.1:9000"
 * ```
 */
export function parseRunArgs(
  tool: string,
  argv: readonly string[],
  env: Record<string, string | undefined>,
): RunArgsResult {
  if (!isToolName(tool)) return _invalidTool(tool);
  const profiler = TOOLS[tool].profiler;
  const boundary = argv.indexOf("--");
  if (boundary === -1) {
    if (argv.includes("--help") || argv.includes("-h")) {
      return { kind: "help", exitCode: 0, text: toolHelp(tool) };
    }
    return _error(tool, "separate KCoral options from tool arguments with '--'", []);
  }
  const scanned = scanOptions(_toolOptions(profiler), argv.slice(0, boundary));
  if (scanned.kind === "help") return { kind: "help", exitCode: 0, text: toolHelp(tool) };
  if (scanned.kind === "error") return _error(tool, scanned.message, []);
  const forwarded = argv.slice(boundary + 1);
  if (forwarded.length === 0) return _error(tool, "arguments are required after '--'", []);
  const text = (name: string) => scanned.stores.get(name) as string | undefined;
  const integer = (name: string) => scanned.stores.get(name) as bigint | undefined;
  const warnings: string[] = [];
  const connection = resolveConnection(
    { url: text("url"), host: text("host"), port: integer("port") },
    env.KCORAL_URL,
  );
  if (connection.warning !== undefined) warnings.push(connection.warning);
  if ("error" in connection) return _error(tool, connection.error, warnings);
  const token = text("token") ?? (env.KCORAL_TOKEN || null);
  if (token !== null && !/^[\x21-\x7e]+$/.test(token)) {
    return _error(tool, "--token must be visible ASCII characters, without spaces", warnings);
  }
  const caFile = text("ca_file") ?? (env.KCORAL_CA_FILE || null);
  if (caFile === "") return _error(tool, "--ca-file must not be empty", warnings);
  const timeout = integer("timeout") ?? BigInt(DEFAULT_TIMEOUT_SECONDS);
  if (timeout <= 0n) return _error(tool, "--timeout must be positive", warnings);
  const limit = integer("output_limit_bytes") ?? BigInt(DEFAULT_OUTPUT_LIMIT_BYTES);
  if (limit <= 0n) return _error(tool, "--output-limit-bytes must be positive", warnings);
  const environment = parseEnvEntries(scanned.appends.get("env") ?? [], env);
  if ("error" in environment) return _error(tool, environment.error, warnings);
  const fetch = scanned.appends.get("fetch") ?? [];
  const out = text("out");
  if (!profiler && (fetch.length > 0) !== (out !== undefined)) {
    return _error(tool, "--fetch and --out must be used together", warnings);
  }
  for (const name of fetch) {
    const checked = relativeParts(name);
    if ("error" in checked) return _error(tool, checked.error, warnings);
  }
  const invalid = validateToolArguments(tool, forwarded);
  if (invalid !== undefined) return _error(tool, invalid, warnings);
  return {
    kind: "ok",
    tool,
    url: connection.url,
    token,
    caFile,
    timeoutSeconds: _clamp(timeout),
    outputLimitBytes: _clamp(limit),
    send: scanned.appends.get("send") ?? [],
    env: environment.env,
    fetch,
    ...(out === undefined ? {} : { out }),
    forwarded,
    warnings,
    ...(scanned.stores.has("verbose") ? { verbose: true } : {}),
  };
}

function _toolOptions(profiler: boolean): OptionSpec[] {
  return [
    { strings: ["-h", "--help"], dest: "help", action: "help" },
    { strings: ["-v", "--verbose"], dest: "verbose", action: "store_true" },
    { strings: ["--url"], dest: "url", action: "store" },
    { strings: ["--host"], dest: "host", action: "store" },
    { strings: ["--port"], dest: "port", action: "store", int: true },
    { strings: ["--token"], dest: "token", action: "store" },
    { strings: ["--ca-file"], dest: "ca_file", action: "store" },
    { strings: ["--timeout"], dest: "timeout", action: "store", int: true },
    { strings: ["--output-limit-bytes"], dest: "output_limit_bytes", action: "store", int: true },
    { strings: ["--send"], dest: "send", action: "append" },
    { strings: ["-e", "--env"], dest: "env", action: "append" },
    { strings: ["--out"], dest: "out", action: "store", required: profiler },
    ...(profiler ? [] : [{ strings: ["--fetch"], dest: "fetch", action: "append" } as const]),
  ];
}

function _clamp(value: bigint): number {
  return value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(value);
}

function _error(tool: ToolName, message: string, warnings: string[]): RunArgsError {
  const text = `${toolUsage(tool)}kcoral run ${tool}: error: ${message}\n`;
  return { kind: "error", exitCode: 2, message, text, warnings };
}

function _invalidTool(tool: string): RunArgsError {
  const choices = TOOL_NAMES.map((name) => pyStrRepr(name)).join(", ");
  return _dispatchError(
    `argument tool: invalid choice: ${pyStrRepr(tool)} (choose from ${choices})`,
  );
}

function _dispatchError(message: string): RunArgsError {
  const text = `${dispatcherUsage()}kcoral run: error: ${message}\n`;
  return { kind: "error", exitCode: 2, message, text, warnings: [] };
}
