/**
 * The `health` tool: the KCoral server's (or Router's) `GET /health`, as `kcoral health`
 * reads it: status, compilation target, versions, load, GPU count and instance.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { fetchHealth } from "../../health.ts";
import { runCall, type ToolExtra, ToolFailure } from "../call.ts";
import type { McpSettings } from "../settings.ts";

/** How long `health` waits for the answer. */
export const HEALTH_TIMEOUT_MS = 10_000;

/** The structured result of `health`. */
export const healthOutput = {
  url: z.string().describe("the URL asked"),
  kind: z.enum(["server", "router"]).describe("a KCoral server, or a Router in front of nodes"),
  status: z.string().describe('"ok", or "unavailable" for a Router with no ready node'),
  target: z.record(z.string(), z.string()).describe(
    'compilation target, e.g. {"arch": "sm_90a"}; {} on a CPU server',
  ),
  versions: z.record(z.string(), z.string()).describe(
    "versions the workers run (python, torch, cuda)",
  ),
  load: z.object({
    request_capacity: z.number().int(),
    requests_in_progress: z.number().int(),
    requests_waiting: z.number().int(),
  }).describe("workers able to take requests, requests running, requests waiting"),
  gpu_count: z.number().int().nullable().describe(
    "GPUs of a server (0 on a CPU server); null for a Router",
  ),
  instance_id: z.string(),
  started_at: z.string(),
};

/**
 * Register `health` on `server`.
 *
 * @example
 * ```ts ignore
 * registerHealth(server, settings);
 * ```
 */
export function registerHealth(server: McpServer, settings: McpSettings): void {
  server.registerTool("health", {
    title: "KCoral health",
    description: "Whether the KCoral server (or Router) is up: status, the compilation target " +
      "(the GPU arch to build kernels for, e.g. sm_90a; none on a CPU server), worker versions " +
      "and load. Cheap; call it first to learn what the server can do.",
    inputSchema: {},
    outputSchema: healthOutput,
    annotations: { readOnlyHint: true, openWorldHint: true },
  }, (_args: Record<string, never>, extra: ToolExtra) =>
    runCall("health", extra, async () => {
      let answer;
      try {
        answer = await fetchHealth(settings.url, HEALTH_TIMEOUT_MS);
      } catch (error) {
        throw new ToolFailure("unreachable", (error as Error).message);
      }
      const body = answer.body;
      return {
        url: answer.url,
        kind: body.gpu_count === null ? "router" : "server",
        status: body.status,
        target: body.target,
        versions: body.versions,
        load: body.load,
        gpu_count: body.gpu_count,
        instance_id: body.instance_id,
        started_at: body.started_at,
      };
    }, settings.log));
}
