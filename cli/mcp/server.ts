/**
 * The MCP server of `kcoral mcp`: the six tools, registered on the official SDK's
 * `McpServer`, each talking to one KCoral server or Router through the TypeScript client.
 *
 * @module
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { KCORAL_VERSION } from "../../options/version.ts";
import type { McpSettings } from "./settings.ts";
import { strictTools } from "./strict_server.ts";
import { registerBenchmarkKernel } from "./tools/benchmark_kernel.ts";
import { registerEvaluateKernel } from "./tools/evaluate_kernel.ts";
import { registerHealth } from "./tools/health.ts";
import { registerProfile } from "./tools/profile.ts";
import { registerRunProgram } from "./tools/run_program.ts";
import { registerRunPython } from "./tools/run_python.ts";

/** The tools of `kcoral mcp`, in the order `tools/list` gives them. */
export const MCP_TOOL_NAMES: readonly string[] = [
  "health",
  "run_python",
  "run_program",
  "profile",
  "benchmark_kernel",
  "evaluate_kernel",
];

/**
 * An MCP server with every KCoral tool, not yet connected to a transport.
 *
 * @example
 * ```ts
 * import { createMcpServer } from "./server.ts";
 *
 * const server = createMcpServer({
 *   url: "http://127.0.0.1:8000", filesDir: "kcoral-files", inlineLimit: 65536,
 *   cwd: Deno.cwd(), log: () => {},
 * });
 * await server.close();
 * ```
 */
export function createMcpServer(settings: McpSettings): McpServer {
  const server = strictTools(
    new McpServer(
      { name: "kcoral", title: "KCoral", version: KCORAL_VERSION },
      {
        capabilities: { tools: {} },
        instructions: `KCoral runs GPU programs on ${settings.url}. Start with health (target ` +
          "arch, load). run_python runs a script; benchmark_kernel compiles and times a CUDA " +
          "entry point; evaluate_kernel judges a candidate against a reference (KernelBench " +
          "format) on secret inputs; profile runs ncu or compute-sanitizer; run_program sends " +
          "raw KCoral " +
          `programs. Large returned files are saved under ${settings.filesDir}.`,
      },
    ),
  );
  registerHealth(server, settings);
  registerRunPython(server, settings);
  registerRunProgram(server, settings);
  registerProfile(server, settings);
  registerBenchmarkKernel(server, settings);
  registerEvaluateKernel(server, settings);
  return server;
}
