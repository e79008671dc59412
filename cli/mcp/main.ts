/**
 * `kcoral mcp`: a Model Context Protocol server over stdio for agent hosts, exposing KCoral as
 * tools (`health`, `run_python`, `run_program`, `profile`, `benchmark_kernel`). Stdout carries
 * the protocol; diagnostics go to stderr. It runs until stdin closes.
 *
 * ```
 * agent host ──stdio (JSON-RPC)──▶ kcoral mcp ──HTTP (KCoral client)──▶ server or Router
 * ```
 *
 * @module
 */
import process from "node:process";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CommandLineError,
  type CommandLineSpec,
  commandLineUsage,
  parseCommandLine,
} from "../../options/command.ts";
import { grantedEnv } from "../../options/defaults.ts";
import type { OptionTable } from "../../options/spec.ts";
import { versionLine } from "../../options/version.ts";
import { resolveServerAddress, serverAddressOptions } from "../server_address.ts";
import { checkServerUrl } from "../voice.ts";
import { createMcpServer } from "./server.ts";
import type { McpSettings } from "./settings.ts";

/** The options of `kcoral mcp`. */
export const mcpOptions = {
  url: serverAddressOptions.url,
  host: serverAddressOptions.host,
  port: serverAddressOptions.port,
  compileUrl: {
    flag: "--compile-url",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "url",
    help: "server that compiles for benchmark_kernel, e.g. a CPU server (default: --url)",
  },
  filesDir: {
    flag: "--files-dir",
    type: "string",
    nonEmpty: true,
    default: "kcoral-mcp-files",
    placeholder: "dir",
    help: "directory for returned files too large to inline (one subdirectory per call)",
  },
  allowSendRoot: {
    flag: "--allow-send-root",
    type: "list",
    items: { type: "string" },
    default: [],
    placeholder: "dir",
    help: "a directory tools may send local files from, besides the working directory " +
      "(repeatable; files elsewhere are refused)",
  },
  token: serverAddressOptions.token,
  caFile: serverAddressOptions.caFile,
  inlineLimit: {
    flag: "--inline-limit",
    type: "int",
    min: 0,
    default: 65536,
    placeholder: "bytes",
    help: "text files (and bytes values) up to this size come back inline",
  },
} as const satisfies OptionTable;

const _COMMAND: CommandLineSpec = {
  name: "kcoral mcp",
  description: "Serve KCoral to an agent host as Model Context Protocol tools over stdio.",
  epilog: "Tools: health, run_python, run_program, profile, benchmark_kernel, evaluate_kernel " +
    "(docs/agents.md; host configurations with narrow permissions there).",
  examples: [
    "# from the project an agent works in (files are sent only from under it)",
    "kcoral mcp --url http://gpu-box:8000 --files-dir kcoral-artifacts",
  ],
  version: versionLine(),
};

/**
 * The settings a command line gives, or the exit status and message of a malformed one.
 *
 * @example
 * ```ts
 * import { parseMcpArgs } from "./main.ts";
 *
 * const parsed = parseMcpArgs(["--port", "9000"], {});
 * if (!("settings" in parsed) || parsed.settings.url !== "http://127.0.0.1:9000") throw new Error();
 * ```
 */
export function parseMcpArgs(
  argv: string[],
  env: Record<string, string | undefined>,
): { settings: McpSettings } | { help: string } | { exitCode: number; message: string } {
  try {
    const parsed = parseCommandLine(argv, mcpOptions, _COMMAND, env);
    if (parsed.kind === "help") return { help: parsed.text.trimEnd() };
    const v = parsed.values;
    const address = resolveServerAddress(v, parsed.sources, env, "kcoral mcp");
    const malformed = v.compileUrl ? checkServerUrl(v.compileUrl, "--compile-url") : null;
    if (malformed) throw new CommandLineError(`kcoral mcp: error: ${malformed}`, 2);
    return {
      settings: {
        url: address.url,
        client: { ...(address.token ? { token: address.token } : {}), caCerts: address.caCerts },
        ...(v.compileUrl ? { compileUrl: v.compileUrl.replace(/\/+$/, "") } : {}),
        filesDir: v.filesDir ?? "kcoral-mcp-files",
        inlineLimit: v.inlineLimit ?? 65536,
        cwd: Deno.cwd(),
        sendRoots: (v.allowSendRoot ?? []).map((dir) =>
          dir.startsWith("/") ? dir : `${Deno.cwd()}/${dir}`
        ),
        log: (line) => console.error(line),
      },
    };
  } catch (error) {
    if (!(error instanceof CommandLineError)) throw error;
    const usage = error.exitCode === 2
      ? `${commandLineUsage(mcpOptions, _COMMAND).trimEnd()}\n`
      : "";
    return { exitCode: error.exitCode, message: `${usage}${error.message}` };
  }
}

/**
 * Run `kcoral mcp ARGS`: serve MCP on stdin/stdout until stdin closes; resolves with the exit
 * status (2 for a malformed command line).
 *
 * @example
 * ```ts ignore
 * import { mcpMain } from "./main.ts";
 * Deno.exit(await mcpMain(["--url", "http://gpu-box:8000"]));
 * ```
 */
export async function mcpMain(
  argv: string[],
  env: Record<string, string | undefined> = grantedEnv(),
): Promise<number> {
  const parsed = parseMcpArgs(argv, env);
  if ("help" in parsed) {
    console.log(parsed.help);
    return 0;
  }
  if ("exitCode" in parsed) {
    console.error(parsed.message);
    return parsed.exitCode;
  }
  const server = createMcpServer(parsed.settings);
  const closed = new Promise<void>((resolve) => {
    process.stdin.once("end", resolve);
    process.stdin.once("close", resolve);
    server.server.onclose = () => resolve();
  });
  await server.connect(new StdioServerTransport());
  parsed.settings.log(`kcoral mcp: serving ${parsed.settings.url} on stdio`);
  await closed;
  await server.close().catch(() => {});
  return 0;
}
