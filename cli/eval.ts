/**
 * `kcoral eval`: judge a candidate kernel against a reference (KernelBench's file format) on a
 * KCoral server or Router, with split trust (docs/eval.md). Exit status 0 when the candidate is
 * correct and unflagged, 1 when it is incorrect or flagged (or no verdict could be had: the
 * error is printed as `kcoral run` prints it), 2 for a malformed command line.
 *
 * ```
 *  --reference REF.py --candidate CAND.py [--seeds N] [--send PATH ...] [--json]
 *    ─▶ Client.evaluate (inputs step, candidate step, judge step)
 *    ─▶ the verdict as text (or --json) ─▶ exit 0 / 1
 * ```
 *
 * @module
 */
import {
  Client,
  DEFAULT_TIMING_SETS,
  type EvaluateOptions,
  isAccepted,
  type Verdict,
} from "../client/mod.ts";
import {
  CommandLineError,
  type CommandLineSpec,
  commandLineUsage,
  parseCommandLine,
} from "../options/command.ts";
import type { OptionTable, OptionTableValues } from "../options/spec.ts";
import { versionLine } from "../options/version.ts";
import { describeError } from "./run/execute.ts";
import { readSendFiles } from "./eval_files.ts";
import { evaluateTiming } from "./eval_timing.ts";
import { resolveServerAddress, serverAddressOptions } from "./server_address.ts";

/** The options of `kcoral eval`. */
export const evalOptions = {
  reference: {
    flag: "--reference",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "REF.py",
    help: "the reference file: class Model, get_inputs(), get_init_inputs() (required)",
  },
  candidate: {
    flag: "--candidate",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "CAND.py",
    help: "the candidate file: class ModelNew with Model's constructor arguments (required)",
  },
  seeds: {
    flag: "--seeds",
    type: "int",
    default: 3,
    placeholder: "N",
    help: "correctness input sets, each from a new secret seed (at least 3)",
  },
  timingSets: {
    flag: "--timing-sets",
    type: "int",
    default: DEFAULT_TIMING_SETS,
    placeholder: "N",
    help: "separate timing input sets, in a new random order every round",
  },
  send: {
    flag: "--send",
    type: "list",
    items: { type: "string", nonEmpty: true },
    default: [],
    placeholder: "PATH",
    help: "a file or directory every step's worker gets in its working directory",
  },
  atol: {
    flag: "--atol",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "x",
    help: "absolute tolerance over the dtype's default (KernelBench's: 1e-4 float32, 1e-2 half)",
  },
  rtol: {
    flag: "--rtol",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "x",
    help: "relative tolerance over the dtype's default",
  },
  determinism: {
    flag: "--determinism",
    type: "choice",
    choices: ["auto", "on", "off"],
    default: "auto",
    help: "require the same outputs from the same inputs (auto: unless DETERMINISTIC = False)",
  },
  excessiveSpeedup: {
    flag: "--excessive-speedup",
    type: "number",
    default: 10,
    placeholder: "x",
    help: "flag speedups above this",
  },
  warmup: {
    flag: "--warmup",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "N",
    help: "untimed calls before timing (default 10 on a GPU, 2 on a CPU)",
  },
  repeat: {
    flag: "--repeat",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "N",
    help: "time this fixed count of calls (default on a GPU: adaptive rounds of 20 until the " +
      "median's 95 % CI is within 0.5 % or 1 s; on a CPU: 10)",
  },
  adaptive: {
    flag: "--adaptive",
    type: "boolean",
    default: false,
    help: "GPU: with --repeat N, time rounds of N calls until the median's 95 % CI is within " +
      "0.5 % (without --repeat this is the default)",
  },
  noBracket: {
    flag: "--no-bracket",
    type: "boolean",
    default: false,
    help: "skip timing the reference a second time in the candidate's worker (the speedup's " +
      "interval then counts sampling noise only)",
  },
  inputsUrl: {
    flag: "--inputs-url",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "url",
    help: "generate the inputs on this server instead (e.g. a CPU compile server)",
  },
  timeoutSeconds: {
    flag: "--timeout",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "s",
    help: "each step's execution deadline (default: the server's)",
  },
  json: {
    flag: "--json",
    type: "boolean",
    default: false,
    help: "print the verdict as JSON",
  },
  url: serverAddressOptions.url,
  host: serverAddressOptions.host,
  port: serverAddressOptions.port,
  token: serverAddressOptions.token,
  caFile: serverAddressOptions.caFile,
} as const satisfies OptionTable;

const _COMMAND: CommandLineSpec = {
  name: "kcoral eval",
  description: "Judge a candidate kernel against a reference: correctness on new secret " +
    "inputs, reward-hack checks and flags, and both timed, with split trust.",
  epilog: "Exit status 0 when the candidate is correct and unflagged, 1 when it is incorrect " +
    "or flagged or no verdict could be had, 2 for a malformed command line.",
  version: versionLine(),
};

function _fmt(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return "-";
  return ms >= 100
    ? `${ms.toFixed(1)} ms`
    : ms >= 1
    ? `${ms.toFixed(3)} ms`
    : `${ms.toPrecision(3)} ms`;
}

/**
 * The readable form of a verdict.
 *
 * @example
 * ```ts
 * import { formatVerdict } from "./eval.ts";
 *
 * const text = formatVerdict({
 *   correct: false, flags: ["inputs_modified"], device: "cpu", speedup: 1.5, speedup_ci95: null,
 *   reference: null, candidate: null, receipt: null,
 *   checks: { correctness: { sets: 3, matched: 2, reasons: ["output: 1 of 4 elements differ"] } },
 *   phases_ms: { worker_start: 1, input_generation: 1, candidate_load: 1, candidate_correctness: 1,
 *     candidate_timing: 1, candidate_unfinished: 0, reference: 1, reference_timing: 1,
 *     reference_bracket: 0, comparison: 1, bundle_decode: 1, transfer: 1, client: 1, total: 11,
 *     total_excluding_compile: 10 },
 *   worker_phases_ms: {}, seeds: { correctness: 3, timing: 3 },
 *   request_ids: { inputs: "a", candidate: "b", judge: "c" },
 * });
 * if (!text.startsWith("INCORRECT, flagged: inputs_modified")) throw new Error(text);
 * ```
 */
export function formatVerdict(verdict: Verdict): string {
  const head = verdict.correct
    ? (verdict.flags.length === 0
      ? "correct, no flags"
      : `correct, flagged: ${verdict.flags.join(", ")}`)
    : `INCORRECT${verdict.flags.length ? `, flagged: ${verdict.flags.join(", ")}` : ""}`;
  const lines = [head];
  if (verdict.error) {
    lines.push(
      `  error      ${verdict.error.phase}: ${verdict.error.type}: ${verdict.error.message}`,
    );
  }
  const correctness = verdict.checks.correctness as
    | { sets: number; matched: number; reasons: string[]; max_abs_diff?: number | null }
    | undefined;
  if (correctness && correctness.sets === 0) {
    lines.push("  outputs    none compared (the candidate gave no output)");
  } else if (correctness) {
    const diff = correctness.max_abs_diff == null
      ? ""
      : `, max abs diff ${correctness.max_abs_diff.toPrecision(3)}`;
    lines.push(
      `  outputs    ${correctness.matched} of ${correctness.sets} input sets match${diff}`,
    );
    for (const reason of correctness.reasons.slice(0, 3)) lines.push(`             ${reason}`);
  }
  if (verdict.speedup !== null) {
    const ci = verdict.speedup_ci95
      ? ` (95 % CI ${verdict.speedup_ci95[0].toFixed(2)}-${verdict.speedup_ci95[1].toFixed(2)})`
      : "";
    lines.push(`  speedup    ${verdict.speedup.toFixed(2)}x${ci}`);
    const bracket = verdict.reference_bracket;
    if (bracket?.median_ms !== undefined && typeof bracket.drift === "number") {
      const drift = `${bracket.drift >= 0 ? "+" : ""}${(bracket.drift * 100).toFixed(2)} %`;
      lines.push(
        `  bracket    reference in the candidate's worker ${_fmt(bracket.median_ms)} (${drift})`,
      );
    } else if (bracket?.reason) lines.push(`  bracket    not used: ${bracket.reason}`);
  }
  for (
    const [name, t] of [["reference", verdict.reference], ["candidate", verdict.candidate]] as const
  ) {
    if (!t) continue;
    const ci = t.ci95_ms ? ` [${_fmt(t.ci95_ms[0])}, ${_fmt(t.ci95_ms[1])}]` : "";
    lines.push(
      `  ${name.padEnd(10)} median ${
        _fmt(t.latency_ms_median)
      }${ci}, ${t.samples} calls, timing ${t.timing}`,
    );
  }
  const p = verdict.phases_ms;
  lines.push(
    `  time       ${_fmt(p.total)} to the verdict (${
      _fmt(p.total_excluding_compile)
    } without the ` +
      `candidate's load): workers ${_fmt(p.worker_start)}, inputs ${_fmt(p.input_generation)}, ` +
      `candidate ${
        _fmt(
          p.candidate_load + p.candidate_correctness + p.candidate_timing +
            p.candidate_unfinished,
        )
      }, ` +
      `reference ${_fmt(p.reference + p.reference_timing + p.reference_bracket)}, comparison ${
        _fmt(p.comparison)
      }, ` +
      `bundles ${_fmt(p.bundle_decode)}, transfer ${_fmt(p.transfer)}, client ${_fmt(p.client)}`,
  );
  lines.push(`  device     ${verdict.device}`);
  return lines.join("\n");
}

/** A reference or candidate file that cannot be read (printed as its message alone). */
class _FileError extends Error {}

/**
 * The text of a reference or candidate file, or an `Error` whose message says which file and
 * what is wrong with it in words (missing, a directory, unreadable, not UTF-8 text).
 */
async function _readSource(path: string, what: string): Promise<string> {
  const refuse = (why: string) => new _FileError(`cannot read the ${what} file ${path}: ${why}`);
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) throw refuse("no such file");
    if (error instanceof Deno.errors.IsADirectory) throw refuse("it is a directory");
    if (error instanceof Deno.errors.PermissionDenied) throw refuse("permission denied");
    throw refuse((error as Error).message);
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw refuse("not UTF-8 text (a binary file?)");
  }
}

/**
 * Runs `kcoral eval ARGS`; resolves with the exit status.
 *
 * @example
 * ```ts
 * import { evalMain } from "./eval.ts";
 *
 * // No --candidate: a malformed command line, exit status 2, nothing contacted.
 * if (await evalMain(["--reference", "ref.py"], {}) !== 2) throw new Error();
 * ```
 */
export async function evalMain(
  argv: string[],
  env: Record<string, string | undefined> = Deno.env.toObject(),
): Promise<number> {
  let url: string;
  let inputsUrl: string | null;
  let token: string | null;
  let caCerts: string[];
  let values: Partial<OptionTableValues<typeof evalOptions>>;
  let numbers: Record<"atol" | "rtol" | "warmup" | "repeat" | "timeout", number | undefined>;
  try {
    const parsed = parseCommandLine(argv, evalOptions, _COMMAND, env);
    if (parsed.kind === "help") {
      console.log(parsed.text.trimEnd());
      return 0;
    }
    values = parsed.values;
    const error = (message: string) => new CommandLineError(`kcoral eval: error: ${message}`, 2);
    if (!values.reference) throw error("the following argument is required: --reference");
    if (!values.candidate) throw error("the following argument is required: --candidate");
    if ((values.seeds ?? 3) < 3 || (values.seeds ?? 3) > 64) {
      throw error("--seeds must be from 3 to 64");
    }
    const timingSets = values.timingSets ?? DEFAULT_TIMING_SETS;
    if (timingSets < 1 || timingSets > 64) {
      throw error("--timing-sets must be from 1 to 64");
    }
    const number = (
      flag: string,
      text: string | null | undefined,
      check: (n: number) => boolean,
      rule: string,
    ) => {
      if (text === null || text === undefined) return undefined;
      const n = Number(text);
      if (text.trim() === "" || !Number.isFinite(n) || !check(n)) {
        throw error(`argument ${flag}: ${rule}: '${text}'`);
      }
      return n;
    };
    const atLeast0 = (n: number) => n >= 0;
    const integer = (min: number) => (n: number) => Number.isInteger(n) && n >= min;
    numbers = {
      atol: number("--atol", values.atol, atLeast0, "a number >= 0"),
      rtol: number("--rtol", values.rtol, atLeast0, "a number >= 0"),
      warmup: number("--warmup", values.warmup, integer(0), "an integer >= 0"),
      repeat: number("--repeat", values.repeat, integer(1), "an integer >= 1"),
      timeout: number("--timeout", values.timeoutSeconds, (n) => n > 0, "a number > 0"),
    };
    if (!((values.excessiveSpeedup ?? 10) > 1)) throw error("--excessive-speedup must be above 1");
    const address = resolveServerAddress(values, parsed.sources, env, "kcoral eval");
    if (address.warning) console.error(address.warning);
    url = address.url;
    token = address.token;
    caCerts = address.caCerts;
    inputsUrl = values.inputsUrl ?? null;
  } catch (error) {
    if (!(error instanceof CommandLineError)) throw error;
    if (error.exitCode === 2) console.error(commandLineUsage(evalOptions, _COMMAND).trimEnd());
    console.error(error.message);
    return 2;
  }
  const access = { ...(token === null ? {} : { token }), caCerts };
  try {
    // The files first: a file that cannot be read is reported before any server is contacted.
    const reference = await _readSource(values.reference!, "reference");
    const candidate = await _readSource(values.candidate!, "candidate");
    await using client = new Client(url, access);
    await using inputsClient = inputsUrl === null ? null : new Client(inputsUrl, access);
    const tolerance: EvaluateOptions["tolerance"] = {};
    if (numbers.atol !== undefined) tolerance.atol = numbers.atol;
    if (numbers.rtol !== undefined) tolerance.rtol = numbers.rtol;
    const verdict = await client.evaluate({
      reference,
      candidate,
      seeds: values.seeds ?? 3,
      timingSets: values.timingSets ?? DEFAULT_TIMING_SETS,
      tolerance,
      determinism: (values.determinism ?? "auto") as "auto" | "on" | "off",
      excessiveSpeedup: values.excessiveSpeedup ?? 10,
      timing: evaluateTiming({
        warmup: numbers.warmup,
        repeat: numbers.repeat,
        adaptive: values.adaptive ? true : undefined,
      }),
      ...(values.noBracket ? { bracket: false } : {}),
      files: await readSendFiles(values.send ?? [], Deno.cwd()),
      ...(inputsClient === null ? {} : { inputsClient }),
      ...(numbers.timeout === undefined ? {} : { timeoutSeconds: numbers.timeout }),
    });
    console.log(values.json ? JSON.stringify(verdict, null, 2) : formatVerdict(verdict));
    return isAccepted(verdict) ? 0 : 1;
  } catch (error) {
    console.error(
      `kcoral eval: ${error instanceof _FileError ? error.message : describeError(error)}`,
    );
    if (error instanceof Error && "traceback" in error && error.traceback) {
      console.error(String(error.traceback).trimEnd());
    }
    return 1;
  }
}
