/**
 * The frames a server exchanges with a slot's zygote and its children, as named types. The Python
 * side declares the same frames in `runtime_py/kcoral_runtime/frames.py`; a test keeps both in
 * step with docs/architecture.md.
 *
 * @module
 */
import type { Frame } from "./ipc.ts";

/** Server → zygote. */
export type ZygoteCommand =
  | {
    t: "fork";
    c: number;
    env: Record<string, string>;
    unset: string[];
    max_requests: number;
  }
  | { t: "kill"; c: number; grace: number }
  | { t: "shutdown" }
  | { t: "workspace"; name: string };

/** Server → child (relayed by the zygote; `c` is added when sent). */
export type ChildCommand =
  /** `context: false`: learn the devices only; the first lease-taking instruction creates it. */
  | { t: "init"; context?: false }
  | { t: "run"; req: Omit<RunRequest, "program"> }
  | { t: "lease"; a: "granted" };

/** The `req` of a `run` frame (docs/architecture.md §3.3). */
export interface RunRequest {
  /** The request's id. */
  request_id: string;
  /** The program JSON text as received; sent as the `run` frame's tail, not in its JSON. */
  program: Uint8Array;
  /** SHA-256 → path of the file holding those bytes, as the child sees it. */
  blobs: Record<string, string>;
  /** The program's working directory, as the child sees it. */
  workspace: string;
  /** An empty directory for result parts and capture files, as the child sees it. */
  results: string;
  /** Captured output kept per stream (0: capture off). */
  output_limit_bytes: number;
  /** The response limit: an answer over it is not sent (`too_large`). */
  max_return_bytes: number;
  /** The child runs in a sandbox (reuse hygiene includes the sandbox checks). */
  sandbox: boolean;
  /** The server granted the lease with the program (the child starts holding it). */
  lease_held?: boolean;
  /** A kept child answers before its reuse hygiene and reports it with `clean`. */
  reply_before_reset?: boolean;
  /** `X-KCoral-Keep-Returns`: binary returns of at least this many bytes are kept. */
  keep_min_bytes?: number;
  /** ... while the kept ones total at most this many (the share of the blob cache). */
  keep_max_bytes?: number;
}

/** Zygote → server (never tagged `"child": true`). */
export type ZygoteReport =
  | {
    t: "hello";
    pid: number;
    python: string;
    versions: Record<string, string>;
    mode: string;
    monotonic_ns: number;
    sim_devices?: number;
  }
  | { t: "forked"; c: number; pid: number; monotonic_ns?: number }
  | {
    t: "exited";
    c: number;
    code: number | null;
    signal: number | null;
    orphans: boolean;
    /** The instruction the child last started in its current request (absent: none). */
    instr?: number;
  }
  | { t: "error"; message: string };

/** Child → server (relayed by the zygote, which adds `c` and `"child": true`). */
export type ChildReport =
  | {
    t: "ready";
    c: number;
    target: Record<string, string>;
    versions: Record<string, string>;
    device_uuids: string[];
    /** GPU and simulated workers: the context exists, or waits for the first lease. */
    context?: "created" | "deferred";
  }
  | { t: "init_failed"; c: number; message: string; traceback?: string }
  | { t: "instr"; c: number; i: number }
  | { t: "lease"; c: number; a: "acquire" | "release" }
  | {
    t: "outcome";
    c: number;
    outcome: WorkerOutcome;
    retire: string | null;
    cleanup?: boolean;
    retire_detail?: string;
  }
  | { t: "clean"; c: number; retire: string | null; retire_detail?: string };

/** A file the child wrote into its results directory. */
export interface OutcomeFile {
  /** Its path, as the child sees it (the server maps it to the host). */
  path: string;
  /** Its size in bytes. */
  size: number;
}

/** A binary result part (`return:<k>` is `parts[k]`). */
export interface OutcomePart extends OutcomeFile {
  /** Lowercase hex SHA-256 of its bytes. */
  sha256: string;
}

/**
 * A return the server keeps in its blob cache: written unhashed; its `kept` node in the results
 * JSON carries `placeholder` where the SHA-256 goes, which the server computes while copying the
 * bytes and writes over it (server/execute/kept_returns.ts).
 */
export interface OutcomeKept extends OutcomeFile {
  /** `kcoral-kept-` and 32 lowercase hex digits, once in the results JSON as a string. */
  placeholder: string;
}

/** What the child reports for a finished program (docs/architecture.md §3.4). */
export interface WorkerOutcome {
  /** How the program ended. */
  status: "COMPLETED" | "FAILED";
  /** The results JSON, or `null` when it is in {@linkcode results_file} (large results). */
  results: string | null;
  /** The results JSON as a file beside the parts (large results: no second escaping). */
  results_file?: OutcomeFile;
  /** The failed instruction's error object, `null` when completed. */
  error: Record<string, unknown> | null;
  /** Binary result parts, in `return:<k>` order. */
  parts: OutcomePart[];
  /** Returns for the blob cache (`kept` nodes, protocol/kept_returns.ts): not sent. */
  kept?: OutcomeKept[];
  /** Captured stdout (`null`: capture off). */
  stdout: OutcomeFile | null;
  /** Captured stderr (`null`: capture off). */
  stderr: OutcomeFile | null;
  /** A multipart boundary the child checked against every part it wrote. */
  boundary?: string;
  /** A `cpu_only` function touched CUDA: what and when (the child's monotonic clock). */
  gpu_access?: { cuda_call: string; location: string; detected_at_ns: number } | null;
  /** The answer's JSON was this many bytes, over the response limit: it was not sent. */
  too_large?: number;
  /** The request held the lease: the GPU-state receipt, unchecked here (see gpu_receipt.ts). */
  gpu_receipt?: unknown;
}

/** Every frame type, by who sends it (the tables of docs/architecture.md §3.1). */
export const FRAME_TYPES = {
  zygoteCommands: ["fork", "kill", "shutdown", "workspace"],
  childCommands: ["init", "run", "lease"],
  zygoteReports: ["hello", "forked", "exited", "error"],
  childReports: ["ready", "init_failed", "instr", "lease", "outcome", "clean"],
} as const;

/** A frame that does not have the shape its type says (the worker answered nonsense). */
export class FrameShapeError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "FrameShapeError";
  }
}

const _isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);
const _isStr = (v: unknown): v is string => typeof v === "string";
const _isObj = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);
const _isIntOrNull = (v: unknown) => v === null || _isInt(v);
const _isStrOrNull = (v: unknown) => v === null || _isStr(v);

/** Field checks per report type: every listed field must pass (others are ignored). */
const _ZYGOTE_FIELDS: Record<string, Record<string, (v: unknown) => boolean>> = {
  hello: { pid: _isInt, python: _isStr, versions: _isObj, mode: _isStr, monotonic_ns: _isInt },
  forked: { c: _isInt, pid: _isInt },
  exited: {
    c: _isInt,
    code: _isIntOrNull,
    signal: _isIntOrNull,
    orphans: (v) => v === true || v === false,
    instr: (v) => v === undefined || (_isInt(v) && (v as number) >= 0),
  },
  error: { message: _isStr },
};

const _CHILD_FIELDS: Record<string, Record<string, (v: unknown) => boolean>> = {
  ready: {
    c: _isInt,
    target: _isObj,
    versions: _isObj,
    device_uuids: Array.isArray,
    context: (v) => v === undefined || v === "created" || v === "deferred",
  },
  init_failed: { c: _isInt, message: _isStr },
  instr: { c: _isInt, i: _isInt },
  lease: { c: _isInt, a: (v) => v === "acquire" || v === "release" },
  outcome: { c: _isInt, outcome: _isWorkerOutcome, retire: _isStrOrNull },
  clean: { c: _isInt, retire: _isStrOrNull },
};

function _isWorkerOutcome(v: unknown): boolean {
  if (!_isObj(v)) return false;
  if (v.status !== "COMPLETED" && v.status !== "FAILED") return false;
  if (!(v.results === null || _isStr(v.results))) return false;
  if (!(v.error === null || _isObj(v.error))) return false;
  if (v.parts !== undefined && !Array.isArray(v.parts)) return false;
  return true;
}

function _check<T>(
  frame: Frame,
  fields: Record<string, Record<string, (v: unknown) => boolean>>,
): T {
  const checks = fields[frame.t];
  if (!checks) throw new FrameShapeError(`unexpected worker frame '${frame.t}'`);
  for (const [name, ok] of Object.entries(checks)) {
    if (!ok(frame[name])) {
      throw new FrameShapeError(`worker frame '${frame.t}' has a malformed '${name}'`);
    }
  }
  return frame as unknown as T;
}

/** A zygote's own frame, typed; throws {@linkcode FrameShapeError} for a bad type or field. */
export function parseZygoteReport(frame: Frame): ZygoteReport {
  return _check<ZygoteReport>(frame, _ZYGOTE_FIELDS);
}

/** A child's frame (relayed by its zygote), typed; throws {@linkcode FrameShapeError}. */
export function parseChildReport(frame: Frame): ChildReport {
  return _check<ChildReport>(frame, _CHILD_FIELDS);
}
