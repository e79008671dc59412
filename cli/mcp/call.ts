/**
 * One tool call of `kcoral mcp`: the handler's body runs with the call's abort signal and a
 * progress reporter; what it returns becomes the structured result (and its JSON text), and
 * whatever it throws becomes an MCP tool error (`isError: true`) whose text starts with the
 * error kind, so a failure never crashes the tool process.
 *
 * ```
 * tools/call ─▶ runCall(name, extra, body)
 *   body resolves  ─▶ { content: [JSON text], structuredContent }
 *   body throws    ─▶ { isError: true, content: ["<kind>: <message>\n\n<details>"] }
 *   client cancels ─▶ extra.signal aborts the KCoral request; the SDK drops the answer
 * ```
 *
 * @module
 */
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type {
  CallToolResult,
  ServerNotification,
  ServerRequest,
} from "@modelcontextprotocol/sdk/types.js";
import {
  KCoralError,
  type ProgramResult,
  ProtocolError,
  TransportError,
  ValidationError,
} from "../../client/mod.ts";
import { PackError } from "../run/pack.ts";
import { ProgressReporter } from "./progress.ts";
import { savedFileLinks } from "./resource_links.ts";

/** What the SDK hands a tool handler besides its arguments. */
export type ToolExtra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/**
 * A tool failure with a kind: the KCoral server's error kind (`compile`, `runtime`,
 * `unavailable`, `timeout`, ...) or one of ours (`invalid_input`, `transport`, `protocol`,
 * `unreachable`, `local_io`, `cancelled`).
 *
 * @example
 * ```ts
 * import { ToolFailure } from "./call.ts";
 *
 * const failure = new ToolFailure("invalid_input", "give exactly one of source or script");
 * if (failure.kind !== "invalid_input") throw new Error();
 * ```
 */
export class ToolFailure extends Error {
  /** The error kind, first on the error text. */
  readonly kind: string;
  /** More lines after the message (a remote traceback, the output's tail). */
  readonly details: string;

  /** Create the failure. */
  constructor(kind: string, message: string, details = "") {
    super(message);
    this.name = "ToolFailure";
    this.kind = kind;
    this.details = details;
  }
}

/**
 * The failure of a program that did not complete: the server's error kind and message, and as
 * details the failing instruction, the remote traceback and the tails of stdout and stderr.
 *
 * @example
 * ```ts
 * import { ProgramResult } from "../../client/mod.ts";
 * import { remoteFailure } from "./call.ts";
 *
 * const result = new ProgramResult({
 *   status: "FAILED", requestId: "r1", queueMs: 0, elapsedMs: 1, leaseWaitMs: 0, leaseHeldMs: 0,
 *   results: new Map(), stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
 *   gpuIds: [], error: { kind: "compile", message: "k.cu(3): error: expected a ';'",
 *     instructionIndex: 2, instructionOp: "run", instructionId: "library", traceback: "" },
 * });
 * const failure = remoteFailure(result);
 * if (failure.kind !== "compile" || !failure.details.includes("instruction 2 (run library)")) {
 *   throw new Error(failure.details);
 * }
 * ```
 */
export function remoteFailure(result: ProgramResult, context = ""): ToolFailure {
  const error = result.error;
  const lines: string[] = [];
  if (error) {
    const id = error.instructionId ? ` ${error.instructionId}` : "";
    lines.push(
      `failed at instruction ${error.instructionIndex} (${error.instructionOp}${id}), request ${result.requestId}`,
    );
    if (error.cudaCall) lines.push(`CUDA call ${error.cudaCall} at ${error.location ?? "?"}`);
  } else {
    lines.push(`request ${result.requestId}`);
  }
  if (error?.traceback) lines.push(error.traceback.replace(/\n+$/, ""));
  if (result.stdout) lines.push(`stdout (tail):\n${_tail(result.stdout)}`);
  if (result.stderr) lines.push(`stderr (tail):\n${_tail(result.stderr)}`);
  const message = error?.message ?? `the program ${result.status} without error details`;
  return new ToolFailure(error?.kind ?? "failed", context + message, lines.join("\n"));
}

/**
 * The kind, message and details of anything a tool body threw.
 *
 * @example
 * ```ts
 * import { KCoralError } from "../../client/mod.ts";
 * import { describeFailure } from "./call.ts";
 *
 * const busy = describeFailure(new KCoralError(503, "server saturated", { kind: "busy" }));
 * if (busy.kind !== "busy" || busy.message !== "server saturated") throw new Error();
 * ```
 */
export function describeFailure(
  error: unknown,
): { kind: string; message: string; details: string } {
  if (error instanceof ToolFailure) {
    return { kind: error.kind, message: error.message, details: error.details };
  }
  if (error instanceof KCoralError) {
    const request = error.requestId ? `, request ${error.requestId}` : "";
    return {
      kind: error.kind ?? `http_${error.statusCode}`,
      message: error.detail,
      details: `HTTP ${error.statusCode}${request}`,
    };
  }
  if (error instanceof TransportError) return _plain("transport", error);
  if (error instanceof ProtocolError) return _plain("protocol", error);
  if (error instanceof ValidationError || error instanceof PackError) {
    return _plain("invalid_input", error);
  }
  if (error instanceof TypeError && !(error.cause instanceof Error)) {
    return _plain("invalid_input", error);
  }
  if (error instanceof Error && Object.values(Deno.errors).some((type) => error instanceof type)) {
    return _plain("local_io", error);
  }
  if (error instanceof Error) {
    return { kind: "internal", message: `${error.name}: ${error.message}`, details: "" };
  }
  return { kind: "internal", message: String(error), details: "" };
}

/**
 * The MCP tool error for a failure: one text item `<kind>: <message>`, then the details
 * after a blank line.
 *
 * @example
 * ```ts
 * import { toolError } from "./call.ts";
 *
 * const result = toolError("timeout", "execution timed out after 5 s");
 * if (!result.isError || result.content[0].type !== "text") throw new Error();
 * if (result.content[0].text !== "timeout: execution timed out after 5 s") throw new Error();
 * ```
 */
export function toolError(kind: string, message: string, details = ""): CallToolResult {
  const text = details ? `${kind}: ${message}\n\n${details}` : `${kind}: ${message}`;
  return { isError: true, content: [{ type: "text", text }] };
}

/** What a tool body gets. */
export interface CallContext {
  /** Aborted when the client cancels the call: pass it to every request. */
  signal: AbortSignal;
  /** Progress notifications (sent only when the client asked for them). */
  progress: ProgressReporter;
}

/**
 * Run one tool call: `body` under the call's signal and a progress reporter; its result as
 * structured content, or its failure as a tool error. A call the client cancelled is logged
 * to `log` (stderr) as abandoned.
 *
 * @example
 * ```ts ignore
 * server.registerTool("health", config, (args, extra) =>
 *   runCall("health", extra, async ({ signal }) => ({ status: "ok" })));
 * ```
 */
export async function runCall(
  name: string,
  extra: ToolExtra,
  body: (call: CallContext) => Promise<Record<string, unknown>>,
  log: (line: string) => void = (line) => console.error(line),
): Promise<CallToolResult> {
  const progress = new ProgressReporter(extra);
  try {
    const structured = await body({ signal: extra.signal, progress });
    return {
      content: [
        { type: "text", text: JSON.stringify(structured, null, 2) },
        ...savedFileLinks(structured),
      ],
      structuredContent: structured,
    };
  } catch (error) {
    if (extra.signal.aborted) {
      log(`kcoral mcp: ${name}: cancelled by the client; its KCoral request was abandoned`);
      return toolError("cancelled", `${name} was cancelled by the client`);
    }
    const { kind, message, details } = describeFailure(error);
    return toolError(kind, message, details);
  } finally {
    progress.stop();
  }
}

function _plain(kind: string, error: Error) {
  return { kind, message: error.message, details: "" };
}

function _tail(text: string, lines = 20): string {
  return text.replace(/\n+$/, "").split("\n").slice(-lines).join("\n");
}
