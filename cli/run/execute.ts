/**
 * Running one parsed `kcoral run TOOL` command line: check `--out`, pack `--send`, build
 * the program, execute it, replay the result. Every failure becomes exit status 1 with a
 * `kcoral run TOOL: ...` diagnostic on stderr.
 *
 * @module
 */

import {
  Client,
  type ClientOptions,
  KCoralError,
  type OutputChunk,
  ValidationError,
} from "../../client/mod.ts";
import { failureLines } from "../voice.ts";
import { readCaFile } from "../../http/access_options.ts";
import type { RunArgs } from "./args.ts";
import { type ByteSink, writeText } from "./io.ts";
import { assertNewOutput, OutputExistsError, prepareOutput } from "./output.ts";
import { PackError, packInputs } from "./pack.ts";
import { buildToolProgram } from "./program.ts";
import { describePacking, formatBytes, Progress, TransferLine } from "./progress.ts";
import { RemoteFailure, replayResult } from "./replay.ts";
import { readToolSources } from "./sources.ts";
import { watchWaiting } from "./watch.ts";

/** Where {@linkcode runTool} reads and writes. */
export interface RunIO {
  /** Receives exactly the remote stdout. */
  stdout: ByteSink;
  /** Receives the remote stderr, KCoral's messages and, on a terminal, the progress line. */
  stderr: ByteSink;
  /** Directory `--send` and `--out` are relative to (default: the current directory). */
  cwd?: string;
  /** Whether stderr is a terminal: only then is progress shown (default false). */
  isTerminal?: boolean;
  /** Terminal width for the progress line. */
  columns?: number;
}

// Progress is shown only for steps lasting longer than this.
const _PROGRESS_DELAY_MS = 300;

/**
 * Run a validated command line and resolve with the exit status: the subprocess's code,
 * `128 + N` for signal `N`, 1 when a requested output is missing and the code was 0, and 1
 * with a diagnostic for local errors (existing `--out`, bad `--send`), transport, HTTP or
 * protocol errors, and remote failures.
 *
 * @example
 * ```ts ignore
 * import { parseRunArgs } from "./args.ts";
 * import { runTool } from "./execute.ts";
 * const args = parseRunArgs("python", ["--", "-c", "print(1)"], Deno.env.toObject());
 * if (args.kind === "ok") await runTool(args, { stdout: Deno.stdout, stderr: Deno.stderr });
 * ```
 */
export async function runTool(args: RunArgs, io: RunIO): Promise<number> {
  const cwd = io.cwd ?? Deno.cwd();
  const progress = new Progress({
    write: (text) => writeText(io.stderr, text),
    isTerminal: io.isTerminal ?? false,
    columns: io.columns,
    delayMs: _PROGRESS_DELAY_MS,
  });
  try {
    if (args.out !== undefined) await assertNewOutput(args.out, cwd);
    const access = clientAccess(args);
    await using client = new Client(args.url, access);
    const destination = args.out === undefined ? undefined : await prepareOutput(args.out, cwd);
    const sources = await readToolSources(args.tool);
    const packed = await packInputs(args.send, cwd, {
      onProgress: ({ files, bytes }) => progress.update(describePacking(files, bytes)),
    });
    if (args.send.length > 0) {
      progress.update(`kcoral: hashing inputs: ${formatBytes(packed.tar.length)}`, {
        force: true,
      });
    }
    const { program, options } = buildToolProgram(sources, packed.tar, args);
    const transfer = new TransferLine(progress);
    // Live output (docs/live-output.md): printed as it comes from a server that streams it; the
    // replay then writes only the rest. Against one that does not, nothing is printed early.
    const printed = { stdout: "", stderr: "" };
    const onOutput = (chunk: OutputChunk) => {
      progress.end(); // no status line over the program's output from here on
      printed[chunk.stream] += chunk.data;
      writeText(chunk.stream === "stdout" ? io.stdout : io.stderr, chunk.data);
    };
    const result = await _waiting(
      args.url,
      access,
      progress,
      () => transfer.active,
      () =>
        client.execute(program, {
          ...options,
          onProgress: (p) => transfer.update(p),
          onOutput,
        }),
    );
    progress.clear();
    try {
      return await replayResult(result, {
        stdout: io.stdout,
        stderr: io.stderr,
        printed,
        ...(args.out === undefined ? {} : { out: args.out, destination }),
      });
    } finally {
      if (args.verbose) writeText(io.stderr, `${requestLine(result)}\n`);
    }
  } catch (error) {
    progress.clear();
    writeText(
      io.stderr,
      failureLines(`kcoral run ${args.tool}`, describeError(error), error, args.url),
    );
    if (args.verbose && error instanceof KCoralError && error.requestId) {
      writeText(io.stderr, `kcoral: request ${error.requestId}: HTTP ${error.statusCode}\n`);
    }
    return 1;
  }
}

/**
 * The `-v` line of a finished request: its id and the server's timings, to find it in the
 * server's logs (`request_id` of `events.jsonl`, the Router's `request_finished`).
 *
 * @example
 * ```ts
 * import { requestLine } from "./execute.ts";
 *
 * const line = requestLine({
 *   requestId: "7d4c", status: "COMPLETED", queueMs: 0.21, leaseWaitMs: 0, leaseHeldMs: 52.4,
 *   elapsedMs: 60.04,
 * });
 * if (line !== "kcoral: request 7d4c: COMPLETED, queued 0.2 ms, GPU lease wait 0.0 ms, " +
 *   "held 52.4 ms, elapsed 60.0 ms") throw new Error(line);
 * ```
 */
export function requestLine(
  result: {
    requestId: string;
    status: string;
    queueMs: number;
    leaseWaitMs: number;
    leaseHeldMs: number;
    elapsedMs: number;
  },
): string {
  const ms = (value: number) => `${value.toFixed(1)} ms`;
  return `kcoral: request ${result.requestId}: ${result.status}, queued ${ms(result.queueMs)}, ` +
    `GPU lease wait ${ms(result.leaseWaitMs)}, held ${ms(result.leaseHeldMs)}, ` +
    `elapsed ${ms(result.elapsedMs)}`;
}

/**
 * The client options of a command line's token and CA file (the file is read here: an
 * unreadable one is an `Error` naming it).
 *
 * @example
 * ```ts
 * import { clientAccess } from "./execute.ts";
 *
 * const options = clientAccess({ token: "s3cret", caFile: null });
 * if (options.token !== "s3cret" || options.caCerts?.length !== 0) throw new Error();
 * ```
 */
export function clientAccess(
  args: { token: string | null; caFile: string | null },
): ClientOptions {
  return {
    ...(args.token === null ? {} : { token: args.token }),
    caCerts: args.caFile === null ? [] : [readCaFile(args.caFile)],
  };
}

/**
 * The diagnostic text of an error: the bare message for local input and file system
 * errors and remote failures (upstream's `OSError`/`ValueError`/`RuntimeError`),
 * `<TypeName>: <message>` for everything else (transport, HTTP, protocol errors).
 *
 * @example
 * ```ts
 * import { TransportError } from "../../client/mod.ts";
 * import { describeError } from "./execute.ts";
 * describeError(new TransportError("cannot connect to 127.0.0.1:9: refused"));
 * // "TransportError: cannot connect to 127.0.0.1:9: refused"
 * ```
 */
export function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  if (
    error instanceof PackError || error instanceof OutputExistsError ||
    error instanceof RemoteFailure || error instanceof ValidationError ||
    Object.values(Deno.errors).some((type) => error instanceof type)
  ) {
    return error.message;
  }
  return `${error.name}: ${error.message}`;
}

// While `request` runs, show the waiting line, polling the server's load on terminals (paused
// while a transfer line shows bytes moving).
async function _waiting<T>(
  url: string,
  access: ClientOptions,
  progress: Progress,
  paused: () => boolean,
  request: () => Promise<T>,
): Promise<T> {
  if (!progress.enabled) return await request();
  const health = new Client(url, { ...access, connectTimeoutSeconds: 2 });
  const watch = watchWaiting({ progress, health: () => health.health(), paused });
  try {
    return await request();
  } finally {
    // Not awaited: a health request in flight must not delay the result.
    void watch.stop();
    health.close();
  }
}
