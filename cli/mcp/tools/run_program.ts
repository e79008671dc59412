/**
 * The `run_program` tool: a KCoral program given as JSON instructions (`../program_json.ts`),
 * for agents that build programs directly. Returns whether it completed, every returned value
 * as JSON (tensors, bytes and files inline when small, saved otherwise), the output and the
 * server's timings; a FAILED program is a tool error with the server's error kind and message.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { Client } from "../../../client/mod.ts";
import { remoteFailure, runCall, type ToolExtra } from "../call.ts";
import { CallFiles } from "../files.ts";
import { checkSendPath } from "../local_files.ts";
import { buildJsonProgram, instructionSchema } from "../program_json.ts";
import {
  outputOf,
  outputShape,
  safeName,
  timingsOf,
  timingsSchema,
  valueToJson,
} from "../results.ts";
import { filesRoot, type McpSettings } from "../settings.ts";
import { DEFAULT_OUTPUT_LIMIT_BYTES, DEFAULT_TIMEOUT_SECONDS } from "./common.ts";

/** The input of `run_program`. */
export const runProgramInput = {
  instructions: z.array(instructionSchema).min(1).describe(
    "the program, in order: upload (module/tensor/bytes/library/file), get_function, run, return",
  ),
  timeout_seconds: z.number().int().positive().default(DEFAULT_TIMEOUT_SECONDS),
  output_limit_bytes: z.number().int().nonnegative().default(DEFAULT_OUTPUT_LIMIT_BYTES),
  gpu_count: z.number().int().min(1).max(8).optional().describe(
    "run once on 1-8 GPUs of one server",
  ),
};

/** The structured result of `run_program`. */
export const runProgramOutput = {
  results: z.record(z.string(), z.unknown()).describe(
    'returned values by key: JSON values; {"$tensor": {dtype, shape, data | saved_path}}, ' +
      '{"$bytes": {size, base64 | saved_path}}, {"$file": {...}}, {"$folder": [...]}, {"$int": "digits"}',
  ),
  ...outputShape,
  timings: timingsSchema,
  gpu_ids: z.array(z.number().int()).describe("physical GPUs used (with gpu_count)"),
  files_directory: z.string().nullable().describe("where this call saved files, if it did"),
};

/**
 * Register `run_program` on `server`.
 *
 * @example
 * ```ts ignore
 * registerRunProgram(server, settings);
 * ```
 */
export function registerRunProgram(server: McpServer, settings: McpSettings): void {
  server.registerTool(
    "run_program",
    {
      title: "Run a KCoral program",
      description: "Run a KCoral program given as JSON instructions: upload a Python module " +
        "(source), tensors (dtype, shape, data), bytes, libraries or files; get_function from a " +
        'module ({"$ref": id}); run it with args ({"$ref": id} for earlier values, {"$float": 2} ' +
        "for a float); return values, files or folders by key. Returns the values, output and " +
        "timings; a failed instruction is an error with the server's kind and message.",
      inputSchema: runProgramInput,
      outputSchema: runProgramOutput,
      annotations: { openWorldHint: true },
    },
    (input: z.infer<z.ZodObject<typeof runProgramInput>>, extra: ToolExtra) =>
      runCall("run_program", extra, async (call) => {
        const program = await buildJsonProgram(
          input.instructions,
          settings.cwd,
          (path) => checkSendPath(settings, path, "local_path"),
        );
        await using client = new Client(settings.url, settings.client);
        call.progress.phase(`running the program on ${settings.url}`);
        const result = await client.execute(program, {
          timeoutSeconds: input.timeout_seconds,
          outputLimitBytes: input.output_limit_bytes,
          ...(input.gpu_count === undefined ? {} : { gpuCount: input.gpu_count }),
          signal: call.signal,
          onProgress: (p) => call.progress.transfer(p),
        });
        if (!result.completed) throw remoteFailure(result);
        const files = new CallFiles(filesRoot(settings), "run_program", settings.inlineLimit);
        const results: Record<string, unknown> = {};
        for (const [key, value] of result.results) {
          results[key] = await valueToJson(value, safeName(key), files);
        }
        return {
          results,
          ...outputOf(result),
          timings: timingsOf(result),
          gpu_ids: [...result.gpuIds],
          files_directory: files.directory ?? null,
        };
      }, settings.log),
  );
}
