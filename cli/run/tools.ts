/**
 * The `kcoral run` tools: names, uploaded definition modules, and help summaries.
 *
 * @module
 */

/** The tool names accepted by `kcoral run`, in the order help lists them. */
export const TOOL_NAMES = ["python", "compute-sanitizer", "ncu", "run-iket", "shell"] as const;

/** One `kcoral run` tool name. */
export type ToolName = typeof TOOL_NAMES[number];

/** What the command line needs to know about one tool. */
export interface ToolInfo {
  /** The name used on the command line. */
  name: ToolName;
  /** Base name of its definition in `runtime_py/kcoral_runtime/tools/` (without `.py`). */
  module: string;
  /** Profilers require `--out`, do not accept `--fetch`, and need a second `--`. */
  profiler: boolean;
  /** One-line description for `kcoral run --help`. */
  summary: string;
  /** Native part of the usage line, after the first `--`. */
  native: string;
}

/** Every tool, keyed by name. */
export const TOOLS: Readonly<Record<ToolName, ToolInfo>> = {
  python: {
    name: "python",
    module: "python",
    profiler: false,
    summary: "Run a Python script, module, or inline command with the worker's interpreter.",
    native: "[Python options] (SCRIPT | -m MODULE | -c CODE) [arguments]",
  },
  "compute-sanitizer": {
    name: "compute-sanitizer",
    module: "compute_sanitizer",
    profiler: false,
    summary: "Find CUDA memory-access and synchronization errors.",
    native: "[sanitizer options] APPLICATION [arguments]",
  },
  ncu: {
    name: "ncu",
    module: "ncu",
    profiler: true,
    summary: "Collect NVIDIA Nsight Compute kernel performance reports.",
    native: "[ncu options] -- APPLICATION [arguments]",
  },
  "run-iket": {
    name: "run-iket",
    module: "run_iket",
    profiler: true,
    summary: "Collect instrumented kernel execution timelines.",
    native: "profile [profile options] -- APPLICATION [arguments]",
  },
  shell: {
    name: "shell",
    module: "shell",
    profiler: false,
    summary: "Run a shell script, uploaded executable, or program installed on the worker.",
    native: "EXECUTABLE [arguments]",
  },
};

/**
 * Whether `name` is a `kcoral run` tool.
 *
 * @example
 * ```ts
 * import { isToolName } from "./tools.ts";
 * isToolName("ncu"); // true
 * isToolName("bench"); // false
 * ```
 */
export function isToolName(name: string): name is ToolName {
  return (TOOL_NAMES as readonly string[]).includes(name);
}
