/**
 * The runner's outcome (`{"returncode": int, "missing": [str, ...]}`) and the exit status
 * `kcoral run` derives from it (spec cli.md §2.7).
 *
 * @module
 */

import { ProtocolError, type ResultValue } from "../../client/mod.ts";

/** The decoded `outcome` return value. */
export interface ToolOutcome {
  /** The subprocess return code; negative `-N` when it was killed by signal `N`. */
  returncode: number;
  /** Requested outputs that did not exist (`--fetch` paths, `capture.ncu-rep`, ...). */
  missing: string[];
}

/**
 * Decode the `outcome` value returned by the runner.
 *
 * @throws {ProtocolError} when it is not an object with an integer `returncode` and a
 * list of strings `missing`.
 *
 * @example
 * ```ts
 * import type { ResultValue } from "../../client/mod.ts";
 * import { decodeOutcome } from "./outcome.ts";
 * decodeOutcome(new Map<string, ResultValue>([["returncode", 3], ["missing", []]]));
 * // { returncode: 3, missing: [] }
 * ```
 */
export function decodeOutcome(value: ResultValue | undefined): ToolOutcome {
  if (!(value instanceof Map)) throw new ProtocolError("the tool outcome is not an object");
  const returncode = value.get("returncode");
  if (typeof returncode !== "number" || !Number.isSafeInteger(returncode)) {
    throw new ProtocolError("the tool outcome has no integer returncode");
  }
  const missing = value.get("missing") ?? [];
  if (!Array.isArray(missing) || !missing.every((name) => typeof name === "string")) {
    throw new ProtocolError("the tool outcome's missing artifacts are not a list of strings");
  }
  return { returncode, missing: missing as string[] };
}

/**
 * The `kcoral run` exit status: the subprocess code; `128 + N` when it was killed by
 * signal `N` (reported as `-N`); a missing requested output turns 0 into 1 and keeps any
 * other code.
 *
 * @example
 * ```ts
 * import { exitStatus } from "./outcome.ts";
 * exitStatus({ returncode: 7, missing: [] }); // 7
 * exitStatus({ returncode: -15, missing: [] }); // 143
 * exitStatus({ returncode: 0, missing: ["results"] }); // 1
 * exitStatus({ returncode: 3, missing: ["results"] }); // 3
 * ```
 */
export function exitStatus(outcome: ToolOutcome): number {
  let code = outcome.returncode;
  if (outcome.missing.length > 0 && code === 0) code = 1;
  return code >= 0 ? code : 128 - code;
}
