/**
 * The `run_python` tool: `kcoral run python` for agents. Sends inline source and/or local
 * files, runs the worker's Python on the script with arguments and environment, and returns
 * the exit code, the output (with truncation flags), the server's timings and the fetched
 * files (small text inline, the rest saved to the call's directory).
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { relativeParts } from "../../run/paths.ts";
import { validatePythonArguments } from "../../run/validators.ts";
import { runCall, type ToolExtra, ToolFailure } from "../call.ts";
import { CallFiles, type FetchedFile, fetchedFileSchema } from "../files.ts";
import { SOURCE_NAME } from "../inputs.ts";
import { outputOf, outputShape, timingsOf, timingsSchema } from "../results.ts";
import { filesRoot, type McpSettings } from "../settings.ts";
import { executeToolRun } from "../tool_run.ts";
import { exitShape, sendInputShape } from "./common.ts";

/** The input of `run_python`. */
export const runPythonInput = {
  ...sendInputShape,
  script: z.string().min(1).optional().describe(
    "path of the script to run among the sent files (e.g. exp/check.py); default main.py " +
      "when source is given",
  ),
  args: z.array(z.string()).default([]).describe("arguments after the script (sys.argv[1:])"),
  fetch: z.array(z.string().min(1)).default([]).describe(
    "files or directories to bring back, relative to the remote working directory",
  ),
};

/** The structured result of `run_python`. */
export const runPythonOutput = {
  ...exitShape,
  ...outputShape,
  timings: timingsSchema,
  files: z.array(fetchedFileSchema).describe("fetched files: small text inline, others saved"),
  files_directory: z.string().nullable().describe("where this call saved files, if it did"),
};

/**
 * The Python command line of a `run_python` call: the script (`main.py` for inline source)
 * then its arguments, checked as `kcoral run python` checks them.
 *
 * @throws {ToolFailure} kind `invalid_input` with the rule broken.
 *
 * @example
 * ```ts
 * import { pythonCommand } from "./run_python.ts";
 *
 * const argv = pythonCommand({ source: "print(1)", args: ["--n", "3"] });
 * if (argv.join(" ") !== "main.py --n 3") throw new Error(argv.join(" "));
 * ```
 */
export function pythonCommand(
  input: { source?: string; script?: string; args: readonly string[] },
): string[] {
  if (input.source === undefined && input.script === undefined) {
    throw new ToolFailure("invalid_input", "give source (Python text) or script (a sent file)");
  }
  const script = input.script ?? SOURCE_NAME;
  const checked = relativeParts(script);
  if ("error" in checked) throw new ToolFailure("invalid_input", `script: ${checked.error}`);
  if (script.startsWith("-")) {
    throw new ToolFailure("invalid_input", `script must be a file path, not an option: ${script}`);
  }
  const forwarded = [script, ...input.args];
  const invalid = validatePythonArguments(forwarded);
  if (invalid !== undefined) throw new ToolFailure("invalid_input", invalid);
  return forwarded;
}

/**
 * Register `run_python` on `server`.
 *
 * @example
 * ```ts ignore
 * registerRunPython(server, settings);
 * ```
 */
export function registerRunPython(server: McpServer, settings: McpSettings): void {
  server.registerTool(
    "run_python",
    {
      title: "Run Python on the KCoral server",
      description: "Run a Python script with the GPU worker's interpreter (torch, CUDA) in a " +
        "fresh working directory that holds the sent files. Give `source` (sent as main.py) " +
        "and/or `send` local files with `script`. Returns the exit code, stdout/stderr with " +
        "truncation flags, the server's timings (queue, elapsed, GPU lease wait/held) and the " +
        "`fetch`ed files. The call runs until the script ends or timeout_seconds.",
      inputSchema: runPythonInput,
      outputSchema: runPythonOutput,
      annotations: { openWorldHint: true },
    },
    (input: z.infer<z.ZodObject<typeof runPythonInput>>, extra: ToolExtra) =>
      runCall("run_python", extra, async (call) => {
        const forwarded = pythonCommand(input);
        for (const name of input.fetch) {
          const checked = relativeParts(name);
          if ("error" in checked) throw new ToolFailure("invalid_input", `fetch: ${checked.error}`);
        }
        const run = await executeToolRun(
          {
            tool: "python",
            forwarded,
            env: input.env,
            fetch: input.fetch,
            returnOutputs: input.fetch.length > 0,
            send: {
              send: input.send,
              ...(input.source === undefined ? {} : { source: input.source }),
            },
            timeoutSeconds: input.timeout_seconds,
            outputLimitBytes: input.output_limit_bytes,
          },
          settings,
          call,
        );
        const files = new CallFiles(filesRoot(settings), "run_python", settings.inlineLimit);
        const fetched: FetchedFile[] = [];
        for (const [path, file] of run.outputs?.files ?? []) {
          fetched.push(await files.describe(path, file));
        }
        return {
          exit_code: run.outcome.returncode,
          missing: run.outcome.missing,
          ...outputOf(run.result),
          timings: timingsOf(run.result),
          files: fetched,
          files_directory: files.directory ?? null,
        };
      }, settings.log),
  );
}
