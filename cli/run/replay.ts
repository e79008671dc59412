/**
 * After the response: replay the remote output, save the artifacts, report failures and
 * missing outputs, and compute the exit status (spec cli.md §2.6, §2.7).
 *
 * @module
 */

import { type ProgramResult, ProtocolError, ReturnedFolder } from "../../client/mod.ts";
import { type ByteSink, writeText } from "./io.ts";
import { decodeOutcome, exitStatus } from "./outcome.ts";
import { ARTIFACTS_KEY, OUTCOME_KEY } from "./program.ts";

/** The program did not complete (FAILED): the message is the whole diagnostic. */
export class RemoteFailure extends Error {
  /**
   * Create the failure.
   *
   * @param message `<status>: <message>` and the remote traceback on the next lines.
   */
  constructor(message: string) {
    super(message);
    this.name = "RemoteFailure";
  }
}

/** Where {@linkcode replayResult} writes and saves. */
export interface ReplayTarget {
  /** Local stdout: receives exactly the remote stdout. */
  stdout: ByteSink;
  /** Local stderr: the remote stderr, then KCoral's own messages. */
  stderr: ByteSink;
  /**
   * What live output already printed of each stream: only the rest of the result's output is
   * written (all of it when what was printed is not its beginning).
   */
  printed?: { stdout: string; stderr: string };
  /** `--out` as given (shown in the "saved artifacts" message). */
  out?: string;
  /** Where to save the artifacts folder (see `prepareOutput`); required with `out`. */
  destination?: string;
}

/**
 * Handle a response, in upstream's order: remote stdout to stdout, remote stderr to
 * stderr; `kcoral: remote output was truncated` if either was; save the `artifacts` folder
 * and say `kcoral: saved artifacts to OUT`; fail if the program did not complete; report
 * `kcoral: missing artifacts: a, b`. Resolves with the exit status.
 *
 * @throws {RemoteFailure} when the program FAILED (after the output was replayed).
 * @throws {ProtocolError} when the outcome or the artifacts are malformed.
 *
 * @example
 * ```ts
 * import { ProgramResult, type ResultValue } from "../../client/mod.ts";
 * import { MemorySink } from "./io.ts";
 * import { replayResult } from "./replay.ts";
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 1, leaseWaitMs: 0,
 *   leaseHeldMs: 1, stdout: "out\n", stderr: "err\n", stdoutTruncated: false,
 *   stderrTruncated: false, error: null, gpuIds: [],
 *   results: new Map([["outcome", new Map<string, ResultValue>([["returncode", -15], ["missing", []]])]]),
 * });
 * const stdout = new MemorySink();
 * const stderr = new MemorySink();
 * await replayResult(result, { stdout, stderr }); // 143
 * stdout.text(); // "out\n"
 * ```
 */
export async function replayResult(result: ProgramResult, target: ReplayTarget): Promise<number> {
  writeText(target.stdout, _rest(result.stdout, target.printed?.stdout ?? ""));
  writeText(target.stderr, _rest(result.stderr, target.printed?.stderr ?? ""));
  if (result.stdoutTruncated || result.stderrTruncated) {
    writeText(target.stderr, "kcoral: remote output was truncated\n");
  }
  if (target.out !== undefined && result.has(ARTIFACTS_KEY)) {
    const folder = result.get(ARTIFACTS_KEY);
    if (!(folder instanceof ReturnedFolder)) throw new ProtocolError("artifacts is not a folder");
    await folder.save(target.destination ?? target.out);
    writeText(target.stderr, `kcoral: saved artifacts to ${target.out}\n`);
  }
  if (!result.completed) {
    const error = result.error;
    const traceback = (error?.traceback ?? "").replace(/\n+$/, "");
    const message = `${result.status}: ${error?.message ?? "no error details"}`;
    throw new RemoteFailure(traceback === "" ? message : `${message}\n${traceback}`);
  }
  const outcome = decodeOutcome(result.has(OUTCOME_KEY) ? result.get(OUTCOME_KEY) : undefined);
  if (outcome.missing.length > 0) {
    writeText(target.stderr, `kcoral: missing artifacts: ${outcome.missing.join(", ")}\n`);
  }
  return exitStatus(outcome);
}

/** `text` less its beginning `printed` (all of it when `printed` is not its beginning). */
function _rest(text: string, printed: string): string {
  return text.startsWith(printed) ? text.slice(printed.length) : text;
}
