/**
 * Usage lines and help texts of `kcoral run` and `kcoral run TOOL`, laid out like
 * argparse output (which upstream KCoral prints).
 *
 * @module
 */

import { TOOL_NAMES, type ToolName, TOOLS } from "./tools.ts";
import {
  helpRow as _row,
  usageLines as _usage,
  wrapText as _wrap,
} from "../../options/help_layout.ts";

const _CHOICES = `{${TOOL_NAMES.join(",")}}`;

/**
 * The usage line of `kcoral run` (ends with a newline).
 *
 * @example
 * ```ts
 * import { dispatcherUsage } from "./usage.ts";
 * dispatcherUsage().startsWith("usage: kcoral run [-h] {python,"); // true
 * ```
 */
export function dispatcherUsage(): string {
  return _usage("kcoral run", ["[-h]", _CHOICES, "..."]);
}

/**
 * The help of `kcoral run --help`: the command form and every tool (ends with a newline).
 *
 * @example
 * ```ts
 * import { dispatcherHelp } from "./usage.ts";
 * dispatcherHelp().includes("run-iket"); // true
 * ```
 */
export function dispatcherHelp(): string {
  const tools = TOOL_NAMES.map((name) => _row(`    ${name}`, TOOLS[name].summary));
  return [
    dispatcherUsage(),
    "Run a tool on a remote server (a KCoral server or Router).\n",
    "  kcoral run TOOL [KCoral options] -- [native arguments]\n",
    "tools:",
    `  ${_CHOICES}`,
    ...tools,
    "",
    "options:",
    _row("  -h, --help", "show this help message and exit"),
    _row("  --version", "show program's version number and exit"),
    "",
    ..._wrap(
      "'kcoral run TOOL --help' shows the KCoral options of one tool. Help never contacts " +
        "a server.",
      0,
    ),
  ].join("\n") + "\n";
}

/**
 * The usage line of `kcoral run TOOL` (ends with a newline).
 *
 * @example
 * ```ts
 * import { toolUsage } from "./usage.ts";
 * toolUsage("ncu").includes("--out DIRECTORY"); // true
 * ```
 */
export function toolUsage(tool: ToolName): string {
  const info = TOOLS[tool];
  const output = info.profiler ? ["--out DIRECTORY"] : ["[--fetch PATH]", "[--out DIRECTORY]"];
  return _usage(`kcoral run ${tool}`, [
    "[-h]",
    "[-v]",
    "[--url URL]",
    "[--host HOST]",
    "[--port PORT]",
    "[--token TOKEN]",
    "[--ca-file PATH]",
    "[--timeout SECONDS]",
    "[--output-limit-bytes N]",
    "[--send PATH]",
    "[-e NAME[=VALUE]]",
    ...output,
    `-- ${info.native}`,
  ]);
}

/**
 * The help of `kcoral run TOOL --help`: every KCoral option with its default and the
 * tool's own rules (ends with a newline).
 *
 * @example
 * ```ts
 * import { toolHelp } from "./usage.ts";
 * toolHelp("python").includes("--output-limit-bytes N"); // true
 * ```
 */
export function toolHelp(tool: ToolName): string {
  const info = TOOLS[tool];
  const output = info.profiler ? [_row("  --out DIRECTORY", _PROFILER_OUT[tool] ?? "")] : [
    _row(
      "  --fetch PATH",
      "return a file or directory relative to the remote working directory (no '..'); " +
        "repeatable; requires --out",
    ),
    _row(
      "  --out DIRECTORY",
      "new local directory for the returned files (parents are created); requires --fetch",
    ),
  ];
  return [
    toolUsage(tool),
    ..._wrap(`Run ${tool} on a KCoral worker. ${info.summary}`, 0),
    "",
    ..._wrap(
      "KCoral options go before the first '--'. Everything after it is passed to the tool " +
        "unchanged, even options named like KCoral's (such as --host).",
      0,
    ),
    "",
    "options:",
    _row("  -h, --help", "show this help message and exit"),
    _row(
      "  -v, --verbose",
      "print the request id and the server's timings (queue, GPU lease wait and held, " +
        "elapsed) on stderr when the run ends, to find the request in the server's logs",
    ),
    _row(
      "  --url URL",
      "complete server URL, optionally HTTPS or with a path prefix (default: KCORAL_URL); " +
        "cannot be combined with --host or --port",
    ),
    _row(
      "  --host HOST",
      "HTTP server hostname, IPv4 or IPv6 address, without scheme, port or path; overrides " +
        "KCORAL_URL (default with --port alone: 127.0.0.1)",
    ),
    _row(
      "  --port PORT",
      "HTTP server port, 1 through 65535; overrides KCORAL_URL (default with --host alone: " +
        "8000)",
    ),
    _row(
      "  --token TOKEN",
      "client token of a server or Router started with --client-token, sent as " +
        "'Authorization: Bearer TOKEN' (default: KCORAL_TOKEN, which keeps it out of the " +
        "process list)",
    ),
    _row(
      "  --ca-file PATH",
      "trust this PEM CA certificate for an https:// URL, for self-signed deployments " +
        "(default: KCORAL_CA_FILE)",
    ),
    _row(
      "  --timeout SECONDS",
      "positive integer execution deadline of the request (default: 300; capped by the " +
        "server)",
    ),
    _row(
      "  --output-limit-bytes N",
      "positive integer capture limit for each of stdout and stderr (default: 268435456; " +
        "capped by the server)",
    ),
    _row(
      "  --send PATH",
      "upload a file or directory, preserving its name (a directory keeps its layout); " +
        "repeatable",
    ),
    _row(
      "  -e NAME[=VALUE], --env NAME[=VALUE]",
      "set a remote environment variable; NAME alone copies its local value; repeatable; " +
        "CUDA_VISIBLE_DEVICES and KCORAL_DIR are managed by the worker",
    ),
    ...output,
    "",
    ..._TOOL_NOTES[tool].flatMap((note) => [..._wrap(note, 0), ""]),
  ].join("\n");
}

const _PROFILER_OUT: Partial<Record<ToolName, string>> = {
  ncu: "new local directory for the report, saved as DIRECTORY/capture.ncu-rep (required)",
  "run-iket": "new local directory for every file run-iket writes (required)",
};

const _TOOL_NOTES: Record<ToolName, string[]> = {
  python: [
    "Runs the worker's Python interpreter. A script, -m MODULE or -c CODE is required; -i " +
    "and stdin execution ('-') are unsupported. Python options go before the entry point.",
    "Native help: kcoral run shell -- python --help",
  ],
  "compute-sanitizer": [
    "Runs the worker's compute-sanitizer with the arguments after '--'. Use " +
    "--error-exitcode N to make findings fail, and --log-file PATH with --fetch PATH --out " +
    "DIRECTORY to keep the log.",
    "Native help: kcoral run shell -- compute-sanitizer --help",
  ],
  ncu: [
    "The first '--' starts ncu options, a second '--' (required) the application. KCoral " +
    "selects the export path and capture mode: --export/-o, --import/-i, --mode, " +
    "--config-file, --config-file-path and their abbreviations are refused. NCU_PROFILE=1 is " +
    "set unless given with --env. --fetch is not available.",
    "Native help: kcoral run shell -- ncu --help",
  ],
  "run-iket": [
    "The first '--' starts run-iket arguments, which must include 'profile'; a second '--' " +
    "(required) starts the application. KCoral owns the output and working directories: " +
    "--output-dir/-o and --working-dir are refused. --fetch is not available.",
    "Native help: kcoral run shell -- run-iket profile --help",
  ],
  shell: [
    "Runs EXECUTABLE directly, without a shell: a bare name is searched on the worker's " +
    "PATH, ./program or dir/program is an uploaded file (it needs its executable bit). Use " +
    "bash -c 'COMMANDS' for pipes, redirections or variable expansion.",
  ],
};
