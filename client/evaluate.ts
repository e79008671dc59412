/**
 * Evaluating a candidate kernel against a reference (KernelBench's file format) with split
 * trust: three `/execute` programs, each in a fresh worker, the client carrying data between
 * them (docs/eval.md; the reasons in docs/decisions/eval-split-trust.md).
 *
 * ```
 * client: new secret seeds ──▶ 1. inputs     generate_inputs(reference, seeds), cpu_only
 *                         ◀── inputs bundle (tensors only; its header's SHA-256 kept here)
 *         inputs bundle  ──▶ 2. candidate  run_candidate(candidate, inputs): outputs, own checks,
 *                         ◀── outputs bundle                                  timing
 *         both bundles   ──▶ 3. judge      judge(reference, inputs, outputs): expected outputs
 *                         ◀── verdict JSON                  made only now, comparison, flags
 * ```
 *
 * The bundles stay on the server (kept returns, docs/kept-returns.md): the client gets their
 * digests, and the next step's program names them, so their bytes never cross the wire; through
 * a Router the steps ask for the node that kept them. Where the server sends a bundle anyway (a
 * server without kept returns, a bundle from another server) the client carries it, and when a
 * kept bundle is gone before its step runs (evicted, another node) the evaluation starts again
 * carrying them.
 *
 * Step 1 may run on another server (`inputsClient`, e.g. a CPU compile server): its bundle is
 * carried. Steps 2 and 3 run on `client`'s server, or through a Router.
 *
 * @module
 */

import { Program } from "./program.ts";
import type { ProgramResult } from "./result.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { BlobsNotHeldError, KCoralError } from "./errors.ts";
import { KeptReturn } from "./kept_return.ts";
import { adoptBytes, adoptedDigest, returnedDigest } from "./_known_digests.ts";
import type { Verdict, VerdictPhases } from "./verdict.ts";

/** The least number of correctness input sets. */
export const MIN_CORRECTNESS_SETS = 3;

/**
 * Separate timing input sets by default. Three, so that the order the timed calls visit them
 * in changes from round to round (with two it can only alternate).
 */
export const DEFAULT_TIMING_SETS = 3;

/** A file the steps' workers get in their working directory (e.g. a `.cu` a candidate reads). */
export interface EvaluateFile {
  /** Relative path in the worker's working directory. */
  path: string;
  /** Its bytes. */
  data: Uint8Array;
}

/**
 * Timing settings of both models (the runtime's `benchmark` settings on a GPU). On a GPU a verdict
 * times adaptively by default: 10 warmup calls, then rounds of 20 until the median's 95 % CI
 * half-width is within 0.5 % or 1 s has passed; `repeat` without `adaptive` (or `adaptive: false`)
 * times a fixed count instead.
 */
export interface EvaluateTiming {
  /** Untimed calls first (GPU default 10, or 25 with a fixed count; CPU 2). */
  warmup?: number;
  /** Timed calls: a fixed count (GPU default 100 when fixed; CPU 10), or the round size. */
  repeat?: number;
  /** GPU: rounds of `repeat` calls until the median's CI half-width is within `targetRelCi`. */
  adaptive?: boolean;
  /** GPU: the adaptive target (default 0.005). */
  targetRelCi?: number;
  /** GPU: the adaptive time budget per model, s (default 1). */
  budgetS?: number;
  /** GPU: flush the L2 before every call (default true). */
  flushL2?: boolean;
  /** GPU: leave throttled calls out of the statistics (default false). */
  discardThrottled?: boolean;
}

/** What {@linkcode evaluateKernel} (and `Client.evaluate`) takes. */
export interface EvaluateOptions {
  /** The reference file's source: `class Model`, `get_inputs()`, `get_init_inputs()`. */
  reference: string;
  /** The candidate file's source: `class ModelNew` (a file with only `Model` is its own). */
  candidate: string;
  /** Correctness input sets, each from its own secret seed (default and least: 3). */
  seeds?: number;
  /**
   * Separate timing input sets, each timed call on a copy of one, in a new random order every
   * round and at a randomly chosen address (default {@linkcode DEFAULT_TIMING_SETS}).
   */
  timingSets?: number;
  /** The seed the models' weights are made after (not secret; default 42). */
  initSeed?: number;
  /** atol/rtol over the per-dtype defaults and the problem's `TOLERANCE`. */
  tolerance?: { atol?: number; rtol?: number };
  /** `auto` (the problem's `DETERMINISTIC`, default true), `on` or `off`. */
  determinism?: "auto" | "on" | "off";
  /** Flag `excessive_speedup` above this speedup (default 10). */
  excessiveSpeedup?: number;
  /** Timing settings. */
  timing?: EvaluateTiming;
  /**
   * Time the reference in the candidate's worker too, before the candidate loads, on an input
   * set of its own (default true): the same code timed in two workers differs by more than its
   * sampling noise (clocks under a power cap, memory placement), and `speedup_ci95` then spans
   * the speedup against either timing (`Verdict.reference_bracket`). False saves one reference
   * timing of at most 10 + 50 calls and one input set.
   */
  bracket?: boolean;
  /** Files every step's worker gets (paths relative to its working directory). */
  files?: readonly EvaluateFile[];
  /** Another server for step 1 (input generation), e.g. a CPU compile server. */
  inputsClient?: EvaluateClient;
  /** Each step's timeout, s (default: the server's). */
  timeoutSeconds?: number;
  /** Aborts the evaluation. */
  signal?: AbortSignal;
  /** Called as each step starts: `inputs`, `candidate`, `judge`. */
  onStep?: (step: "inputs" | "candidate" | "judge") => void;
}

/** What the evaluation needs of a client: running programs. */
export interface EvaluateClient {
  /** Runs a program (as `Client.execute`; `keepReturns` and `node` as there). */
  execute(
    program: Program,
    options?: {
      timeoutSeconds?: number;
      signal?: AbortSignal;
      keepReturns?: number;
      node?: string;
    },
  ): Promise<ProgramResult>;
}

/** Bundles of this size and more stay on the server (smaller ones cost little to carry). */
const _KEEP_MIN_BYTES = 1 << 20;

/** A bundle the server kept is gone (evicted, or another node): carry them instead. */
class _KeptBundleGone extends Error {}

/**
 * A step that failed for a reason other than the candidate (the reference raised, a worker
 * refused the inputs): no verdict can be given.
 *
 * @example
 * ```ts
 * import { EvaluationError } from "./evaluate.ts";
 * const error = new EvaluationError("inputs", "runtime", "get_inputs() failed", "", "r1");
 * if (!error.message.startsWith("inputs step failed")) throw new Error(error.message);
 * ```
 */
export class EvaluationError extends Error {
  /** The step: `inputs`, `candidate` or `judge`. */
  readonly step: string;
  /** The server's error kind. */
  readonly kind: string;
  /** The worker's traceback. */
  readonly traceback: string;
  /** The failed request's id. */
  readonly requestId: string;

  /** Create the error. */
  constructor(step: string, kind: string, message: string, traceback: string, requestId: string) {
    super(`${step} step failed (${kind}): ${message}`);
    this.name = "EvaluationError";
    this.step = step;
    this.kind = kind;
    this.traceback = traceback;
    this.requestId = requestId;
  }
}

function _check(options: EvaluateOptions): void {
  const { seeds, timingSets, excessiveSpeedup, tolerance, determinism } = options;
  if (typeof options.reference !== "string" || typeof options.candidate !== "string") {
    throw new TypeError("reference and candidate must be source strings");
  }
  const count = (name: string, value: number | undefined, min: number) => {
    if (value !== undefined && (!Number.isInteger(value) || value < min || value > 64)) {
      throw new RangeError(`${name} must be an integer from ${min} to 64`);
    }
  };
  count("seeds", seeds, MIN_CORRECTNESS_SETS);
  count("timingSets", timingSets, 1);
  if (excessiveSpeedup !== undefined && !(excessiveSpeedup > 1)) {
    throw new RangeError("excessiveSpeedup must be a number above 1");
  }
  for (const key of ["atol", "rtol"] as const) {
    const value = tolerance?.[key];
    if (value !== undefined && !(Number.isFinite(value) && value >= 0)) {
      throw new RangeError(`tolerance.${key} must be a finite number >= 0`);
    }
  }
  if (determinism !== undefined && !["auto", "on", "off"].includes(determinism)) {
    throw new RangeError('determinism must be "auto", "on" or "off"');
  }
}

/** A new secret seed: 63 random bits as a decimal string (torch.manual_seed takes it). */
function _seed(): string {
  const word = new BigUint64Array(1);
  crypto.getRandomValues(word);
  return (word[0] & 0x7fff_ffff_ffff_ffffn).toString();
}

function _timingRequest(timing: EvaluateTiming | undefined): Record<string, unknown> {
  const t = timing ?? {};
  const out: Record<string, unknown> = {};
  if (t.warmup !== undefined) out.warmup = t.warmup;
  if (t.repeat !== undefined) out.repeat = t.repeat;
  if (t.adaptive !== undefined) out.adaptive = t.adaptive;
  if (t.targetRelCi !== undefined) out.target_rel_ci = t.targetRelCi;
  if (t.budgetS !== undefined) out.budget_s = t.budgetS;
  if (t.flushL2 !== undefined) out.flush_l2 = t.flushL2;
  if (t.discardThrottled !== undefined) out.discard_throttled = t.discardThrottled;
  return out;
}

/** One segment of a bundle (eval_bundle.py): kept by the server, or carried. */
type _Segment = Uint8Array | KeptReturn;

/** One step's program: the runtime's entry point called with `args` (bytes uploaded first). */
function _program(
  name: string,
  args: (string | _Segment)[],
  files: readonly EvaluateFile[],
  cpuOnly = false,
): Program {
  const program = new Program();
  for (const file of files) program.uploadFile({ blob: file.data, path: file.path });
  const module = program.upload({
    kind: "module",
    source: `from kcoral_runtime.eval_worker import ${name}\n`,
  });
  const fn = program.getFunction({ module, name, cpuOnly });
  const values = args.map((arg) =>
    typeof arg === "string" ? arg : program.upload({ kind: "bytes", value: arg })
  );
  program.return_({ key: "out", value: program.run({ fn, args: values }) });
  return program;
}

/**
 * A bundle segment a step returned, handed to the next steps' uploads as it is (this module
 * holds it and never changes it): no copy, and its digest the one the response was verified
 * against (computed while it arrived), else computed here once. Returns the digest.
 */
function _adopt(segment: Uint8Array): string {
  const digest = returnedDigest(segment) ?? sha256Hex(segment);
  adoptBytes(segment, digest);
  return digest;
}

/**
 * A bundle a step returned: one `bytes` value, or the list of its segments (each kept by the
 * server or sent). Segments sent are adopted for the next steps' uploads.
 */
function _segments(out: unknown): _Segment[] {
  const segments = (Array.isArray(out) ? out : [out]) as _Segment[];
  for (const segment of segments) if (!(segment instanceof KeptReturn)) _adopt(segment);
  return segments;
}

/**
 * Step 1's bundle as segments, and the SHA-256 of its header when step 1 was asked for it
 * (`header_digest`: the bundle then comes as segments, which the client may not hold).
 */
function _inputsBundle(
  result: ProgramResult,
  asked: boolean,
): { segments: _Segment[]; headerSha: string | null } {
  const out = result.get("out");
  if (!asked || !Array.isArray(out)) return { segments: _segments(out), headerSha: null };
  const [bundle, headerSha] = out as [unknown, string];
  return { segments: _segments(bundle), headerSha };
}

/** Bytes before an eval bundle's header: the magic line and the header's u64 length. */
const _BUNDLE_PREFIX = 16;

/**
 * The SHA-256 of an inputs bundle's header (with the magic and length before it): it names
 * every tensor's SHA-256, so the judge checks the bundle against it, the tensors on several
 * threads (runtime_py/kcoral_runtime/eval_bundle.py). A malformed bundle hashes what there is;
 * the judge refuses it.
 */
function _headerDigest(bundle: Uint8Array): string {
  if (bundle.length < _BUNDLE_PREFIX) return sha256Hex(bundle);
  const view = new DataView(bundle.buffer, bundle.byteOffset, bundle.byteLength);
  const length = view.getBigUint64(8, true);
  const end = length > BigInt(bundle.length - _BUNDLE_PREFIX)
    ? bundle.length
    : _BUNDLE_PREFIX + Number(length);
  return sha256Hex(bundle.subarray(0, end));
}

interface _Step {
  result: ProgramResult;
  wallMs: number;
}

/** How a step runs: whether its large returns stay on the server, and the node to ask for. */
interface _Placement {
  keep: boolean;
  node: string | null;
}

async function _run(
  client: EvaluateClient,
  program: Program,
  options: EvaluateOptions,
  step: "inputs" | "candidate" | "judge",
  placement: _Placement = { keep: false, node: null },
): Promise<_Step> {
  const started = performance.now();
  let result: ProgramResult;
  try {
    result = await client.execute(program, {
      ...(options.timeoutSeconds === undefined ? {} : { timeoutSeconds: options.timeoutSeconds }),
      ...(options.signal === undefined ? {} : { signal: options.signal }),
      ...(placement.keep ? { keepReturns: _KEEP_MIN_BYTES } : {}),
      ...(placement.node === null ? {} : { node: placement.node }),
    });
  } catch (error) {
    if (error instanceof BlobsNotHeldError) throw new _KeptBundleGone(error.message);
    // Bundles of large problems can exceed the server's body limits: say which and what to do.
    if (
      error instanceof KCoralError &&
      (error.kind === "request_too_large" || error.kind === "response_too_large")
    ) {
      const which = error.kind === "request_too_large" ? "request" : "response";
      throw new EvaluationError(
        step,
        error.kind,
        `the ${step} step's ${which} is larger than the server accepts (${error.detail}): the ` +
          "input and output bundles travel in the requests; start the server with a larger " +
          `--max-${which}-bytes, or use fewer --seeds/--timing-sets`,
        "",
        error.requestId ?? "",
      );
    }
    throw error;
  }
  return { result, wallMs: performance.now() - started };
}

function _failure(step: string, result: ProgramResult): EvaluationError {
  const error = result.error;
  return new EvaluationError(
    step,
    error?.kind ?? "failed",
    error?.message ?? `the program ${result.status}`,
    error?.traceback ?? "",
    result.requestId,
  );
}

/** The server's message for an instruction whose worker process died (spec protocol §5). */
const _WORKER_DIED = "worker exited while executing the instruction";

function _noGuard(result: ProgramResult): boolean {
  return !result.completed && result.error?.kind === "unavailable" &&
    result.error.message.includes("cpu_only requires the CUPTI guard");
}

function _sum(record: Record<string, number | null | undefined>, keys: string[]): number {
  return keys.reduce((total, key) => total + (record[key] ?? 0), 0);
}

const _CANDIDATE_KEYS = [
  "reference_bracket",
  "candidate_load",
  "candidate_correctness",
  "candidate_timing",
];
const _JUDGE_KEYS = [
  "judge_decode",
  "reference_load",
  "reference_outputs",
  "comparison",
  "reference_timing",
];

/**
 * The phases of an evaluation that took `totalMs`. `unfinished`: a candidate step that brought
 * back no phase times, its worker dead or killed at the deadline: `serverMs`, its time on the
 * worker (inside the step's answered timings, a 200 FAILED), or `wallMs`, the whole step (a 504 or
 * 500, answered without timings). Every phase is rounded to 1 µs; `client` is what is left of
 * `total` (the client's own work between and around the steps), so the phases add up to `total`.
 */
function _phases(
  steps: { inputs: _Step; candidate: _Step | null; judge: _Step },
  worker: Record<string, number | null>,
  unfinished: { serverMs: number; wallMs: number },
  totalMs: number,
): VerdictPhases {
  const server = (s: _Step | null) => s === null ? 0 : s.result.queueMs + s.result.elapsedMs;
  const inside = (worker.generate ?? 0) + _sum(worker, _CANDIDATE_KEYS) +
    _sum(worker, _JUDGE_KEYS) + unfinished.serverMs;
  const all = [steps.inputs, steps.candidate, steps.judge];
  const serverMs = all.reduce((t, s) => t + server(s), 0);
  const wallMs = all.reduce((t, s) => t + (s?.wallMs ?? 0), 0);
  const load = worker.candidate_load ?? 0;
  const round = (ms: number) => Math.round(ms * 1000) / 1000;
  const phases = {
    worker_start: round(Math.max(serverMs - inside, 0)),
    input_generation: round(worker.generate ?? 0),
    candidate_load: round(load),
    candidate_correctness: round(worker.candidate_correctness ?? 0),
    candidate_timing: round(worker.candidate_timing ?? 0),
    candidate_unfinished: round(unfinished.serverMs + unfinished.wallMs),
    reference: round((worker.reference_load ?? 0) + (worker.reference_outputs ?? 0)),
    reference_timing: round(worker.reference_timing ?? 0),
    reference_bracket: round(worker.reference_bracket ?? 0),
    comparison: round(worker.comparison ?? 0),
    bundle_decode: round(worker.judge_decode ?? 0),
    transfer: round(Math.max(wallMs - serverMs, 0)),
  };
  const total = round(totalMs);
  const accounted = Object.values(phases).reduce((t, ms) => t + ms, 0);
  return {
    ...phases,
    client: round(Math.max(total - accounted, 0)),
    total,
    total_excluding_compile: round(total - phases.candidate_load),
  };
}

/**
 * Evaluate `options.candidate` against `options.reference` on `client`'s server: correctness on
 * new secret inputs, the checks and flags of docs/eval.md, both models timed. Resolves with the
 * {@linkcode Verdict} (also when the candidate fails to load, raises or crashes: then
 * `correct` is false and `error` says why); rejects with {@linkcode EvaluationError} when the
 * reference or the runtime fails, and with the client's errors on transport problems.
 *
 * @example
 * ```ts ignore
 * import { Client } from "./client.ts";
 * import { evaluateKernel } from "./evaluate.ts";
 *
 * await using client = new Client("http://127.0.0.1:8000");
 * const verdict = await evaluateKernel(client, {
 *   reference: await Deno.readTextFile("reference.py"),
 *   candidate: await Deno.readTextFile("candidate.py"),
 * });
 * console.log(verdict.correct, verdict.flags, verdict.speedup);
 * ```
 */
export async function evaluateKernel(
  client: EvaluateClient,
  options: EvaluateOptions,
): Promise<Verdict> {
  _check(options);
  try {
    return await _evaluate(client, options, true);
  } catch (error) {
    if (!(error instanceof _KeptBundleGone)) throw error;
    return await _evaluate(client, options, false); // new seeds, the bundles carried
  }
}

async function _evaluate(
  client: EvaluateClient,
  options: EvaluateOptions,
  keep: boolean,
): Promise<Verdict> {
  const started = performance.now();
  const files = options.files ?? [];
  const seeds = options.seeds ?? MIN_CORRECTNESS_SETS;
  const timingSets = options.timingSets ?? DEFAULT_TIMING_SETS;
  const initSeed = options.initSeed ?? 42;
  const bracket = options.bracket ?? true;
  const timing = _timingRequest(options.timing);
  const tolerance = options.tolerance && Object.keys(options.tolerance).length > 0
    ? options.tolerance
    : null;
  // The client's own work between the steps (programs built, bundles hashed): kept out of a
  // candidate step's `candidate_unfinished` (the `client` phase is what the others leave).
  let clientMs = 0;
  const local = <T>(work: () => T): T => {
    const t0 = performance.now();
    try {
      return work();
    } finally {
      clientMs += performance.now() - t0;
    }
  };

  // 1. Inputs: the secret seeds go to this step only.
  options.onStep?.("inputs");
  // A bundle from another server is carried: only `client`'s server could serve it by digest.
  const keepInputs = keep && options.inputsClient === undefined;
  const secret = JSON.stringify({
    correctness_seeds: Array.from({ length: seeds }, _seed),
    timing_seeds: Array.from({ length: timingSets }, _seed),
    init_seed: initSeed,
    ...(bracket ? { bracket_seed: _seed() } : {}),
    ...(keepInputs ? { header_digest: true } : {}),
  });
  const inputsServer = options.inputsClient ?? client;
  const inputsPlacement = { keep: keepInputs, node: null };
  let inputs = await _run(
    inputsServer,
    local(() => _program("generate_inputs", [options.reference, secret], files, true)),
    options,
    "inputs",
    inputsPlacement,
  );
  if (_noGuard(inputs.result)) {
    // A GPU server without CUPTI cannot watch a cpu_only call: generate under the lease.
    inputs = await _run(
      inputsServer,
      local(() => _program("generate_inputs", [options.reference, secret], files)),
      options,
      "inputs",
      inputsPlacement,
    );
  }
  if (!inputs.result.completed) throw _failure("inputs", inputs.result);
  const { segments: inputsBundle, headerSha } = local(() =>
    _inputsBundle(inputs.result, keepInputs)
  );
  const [inputsFirst, ...inputsRest] = inputsBundle;
  // A bundle in one piece (not asked for its header's digest) is always carried.
  const inputsSha = inputsBundle.length === 1 && inputsFirst instanceof Uint8Array
    ? adoptedDigest(inputsFirst) ?? null
    : null;
  const inputsHeaderSha = headerSha ?? local(() => _headerDigest(inputsFirst as Uint8Array));
  // Through a Router, the next steps ask for the node that keeps the inputs.
  const placement = { keep, node: keepInputs ? inputs.result.node : null };

  // 2. Candidate: its inputs and nothing else.
  options.onStep?.("candidate");
  const candidateRequest = JSON.stringify({
    timing,
    tolerance,
    ...(bracket ? { bracket_reference: options.reference } : {}),
  });
  let candidate: _Step | null = null;
  let crash: NonNullable<Verdict["error"]> | null = null;
  // A candidate step that brought back no phase times (docs/eval.md, `candidate_unfinished`).
  const unfinished = { serverMs: 0, wallMs: 0 };
  const candidateSince = performance.now();
  const clientSince = clientMs;
  try {
    candidate = await _run(
      client,
      local(() =>
        _program(
          "run_candidate",
          [options.candidate, inputsFirst, candidateRequest, ...inputsRest],
          files,
        )
      ),
      options,
      "candidate",
      placement,
    );
  } catch (error) {
    // The server answered, but the candidate's worker died outside an instruction (500) or the
    // candidate ran past the deadline (504): the candidate's doing, so a verdict.
    const candidateFault = error instanceof KCoralError &&
      ((error.statusCode === 500 && error.kind === "engine") ||
        (error.statusCode === 504 && error.kind === "timeout"));
    if (!candidateFault) throw error;
    // Answered without timings: the step's whole time, less the client's own work in it.
    unfinished.wallMs = performance.now() - candidateSince - (clientMs - clientSince);
    const deadline = options.timeoutSeconds === undefined
      ? "the server's default deadline"
      : `its deadline of ${options.timeoutSeconds} s`;
    crash = {
      phase: "candidate",
      type: error.kind!,
      message: error.kind === "timeout"
        ? `the candidate did not finish within ${deadline} (${error.message})`
        : error.message,
      traceback: "",
    };
  }
  if (candidate !== null && !candidate.result.completed) {
    // Its worker died (or failed outside the candidate): no phase times came back.
    unfinished.serverMs = candidate.result.elapsedMs;
    const e = candidate.result.error;
    crash = {
      phase: "candidate",
      type: e?.kind ?? "failed",
      message: e?.message === _WORKER_DIED
        ? "the candidate's worker process died while running it (it exited, e.g. os._exit(), " +
          "was killed by a signal such as a segfault, or was killed for using too much memory)"
        : e?.message ?? "the candidate's worker failed",
      traceback: e?.traceback ?? "",
    };
  }
  const [outputsFirst, ...outputsRest] = crash === null
    ? local(() => _segments(candidate!.result.get("out")))
    : [new Uint8Array(0)];

  // 3. Judge: the expected outputs exist from here on, in a worker that never ran the candidate.
  options.onStep?.("judge");
  const judgeRequest = JSON.stringify({
    inputs_header_sha256: inputsHeaderSha,
    ...(inputsSha === null ? {} : { inputs_sha256: inputsSha }), // a judge without that check
    inputs_segments: inputsBundle.length,
    tolerance,
    determinism: options.determinism ?? "auto",
    excessive_speedup: options.excessiveSpeedup ?? 10,
    timing,
    bracket,
    candidate_failure: crash,
  });
  const judge = await _run(
    client,
    local(() =>
      _program(
        "judge",
        [options.reference, inputsFirst, outputsFirst, judgeRequest, ...inputsRest, ...outputsRest],
        files,
      )
    ),
    options,
    "judge",
    { keep: false, node: candidate?.result.node ?? placement.node },
  );
  if (!judge.result.completed) throw _failure("judge", judge.result);
  const body = JSON.parse(judge.result.get("out") as string) as Omit<
    Verdict,
    "phases_ms" | "seeds" | "request_ids"
  >;
  const worker = body.worker_phases_ms ?? {};
  return {
    ...body,
    phases_ms: _phases(
      { inputs, candidate, judge },
      worker,
      unfinished,
      performance.now() - started,
    ),
    seeds: { correctness: seeds, timing: timingSets },
    request_ids: {
      inputs: inputs.result.requestId,
      candidate: candidate?.result.requestId ?? null,
      judge: judge.result.requestId,
    },
  };
}
