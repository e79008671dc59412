/**
 * Strict tool inputs for `kcoral mcp`: every tool refuses input keys it does not know. Agents mistype argument names (`sourc` for `source`); a lenient schema
 * drops the typo and the call fails later with a vague message, or worse, runs without it. Here
 * each tool's input schema is made strict when it is registered (`additionalProperties: false`
 * in `tools/list`), so the SDK's validation answers with the unknown key's name. Tools register
 * as on the SDK's class (`server.registerTool(name, { inputSchema: { ...shape } }, handler)`);
 * `createMcpServer` wraps the server with {@linkcode strictTools} first.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";

/**
 * `schema` (a zod raw shape, a zod object, or nothing) as a strict zod object; another zod
 * schema (a union, say) as it is.
 *
 * @example
 * ```ts
 * import { z } from "zod";
 * import { strictInputSchema } from "./strict_server.ts";
 *
 * const schema = strictInputSchema({ source: z.string() }) as z.ZodType;
 * if (schema.safeParse({ sourc: "x", source: "y" }).success) throw new Error("not strict");
 * if (!schema.safeParse({ source: "y" }).success) throw new Error();
 * ```
 */
export function strictInputSchema(schema: unknown): unknown {
  if (schema === undefined) return z.strictObject({});
  if (schema instanceof z.ZodObject) return schema.strict();
  if (schema instanceof z.ZodType) return schema;
  return z.strictObject(schema as z.ZodRawShape);
}

/**
 * Makes every tool registered on `server` from now on take a strict input schema
 * ({@linkcode strictInputSchema}); returns `server`. `createMcpServer` applies it before any tool
 * is registered, so every tool of `kcoral mcp`, present and future, is strict.
 *
 * @example
 * ```ts
 * import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
 * import { z } from "zod";
 * import { strictTools } from "./strict_server.ts";
 *
 * const server = strictTools(new McpServer({ name: "t", version: "1" }));
 * const tool = server.registerTool("echo", { inputSchema: { text: z.string() } }, (input: { text: string }) => ({
 *   content: [{ type: "text", text: input.text }],
 * }));
 * if (!(tool.inputSchema as z.ZodType).safeParse({ text: "a", txt: "b" }).error) throw new Error();
 * await server.close();
 * ```
 */
export function strictTools(server: McpServer): McpServer {
  const register = server.registerTool.bind(server);
  server.registerTool =
    ((name: string, config: { inputSchema?: unknown }, callback: unknown) =>
      register(
        name,
        { ...config, inputSchema: strictInputSchema(config.inputSchema) } as never,
        callback as never,
      )) as typeof server.registerTool;
  return server;
}
