/**
 * Short text summaries of profiler reports for the `profile` tool.
 *
 * - Nsight Compute: after the capture, the same request runs
 *   `ncu --import outputs/capture.ncu-rep --csv --page details` on the worker
 *   ({@linkcode NCU_SUMMARY_MODULE}); {@linkcode summarizeNcuCsv} keeps, per profiled kernel,
 *   its launch shape and the headline metrics (duration, throughputs, occupancy, registers).
 * - Compute Sanitizer: {@linkcode summarizeSanitizerLog} keeps the error count and the first
 *   findings of the log.
 *
 * @module
 */

/** Return key of the `ncu --import` answer. */
export const NCU_SUMMARY_KEY = "ncu_summary";

/**
 * Python uploaded after an `ncu` capture: `summarize(overrides)` runs
 * `ncu --import outputs/capture.ncu-rep --csv --page details` in the request's workspace (with
 * the run's environment overrides, so the same `ncu` is found) and returns
 * `{"returncode", "stdout", "stderr"}` (each stream's first 256 KiB), or `{"returncode": null}`
 * when there is no report.
 */
export const NCU_SUMMARY_MODULE = `import os
import subprocess


def summarize(overrides):
    report = os.path.abspath(os.path.join("outputs", "capture.ncu-rep"))
    if not os.path.isfile(report):
        return {"returncode": None, "stdout": "", "stderr": "no report"}
    env = {**os.environ, **overrides}
    proc = subprocess.run(
        ["ncu", "--import", report, "--csv", "--page", "details"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        timeout=120,
    )
    limit = 256 * 1024
    return {
        "returncode": proc.returncode,
        "stdout": proc.stdout[:limit].decode("utf-8", "replace"),
        "stderr": proc.stderr[:limit].decode("utf-8", "replace"),
    }
`;

/** Metrics a kernel's summary line shows, in this order, when the report has them. */
export const NCU_HEADLINE_METRICS: readonly string[] = [
  "Duration",
  "Compute (SM) Throughput",
  "Memory Throughput",
  "DRAM Throughput",
  "Achieved Occupancy",
  "Registers Per Thread",
];

/** One profiled kernel launch. */
export interface NcuKernel {
  /** The launch's ID in the report. */
  id: string;
  /** The kernel's (demangled) name. */
  name: string;
  /** Grid size as ncu prints it, e.g. `(4096, 1, 1)`. */
  grid: string;
  /** Block size, e.g. `(256, 1, 1)`. */
  block: string;
  /** Headline metrics: name → `value unit`. */
  metrics: Record<string, string>;
}

/**
 * Parse CSV as ncu writes it: every field quoted, commas and doubled quotes inside.
 *
 * @example
 * ```ts
 * import { parseCsv } from "./profile_summary.ts";
 *
 * const rows = parseCsv('"a","b,c"\n"1","say ""hi"""\n');
 * if (rows[0][1] !== "b,c" || rows[1][1] !== 'say "hi"') throw new Error();
 * ```
 */
export function parseCsv(text: string): string[][] {
  const rows: string[][] = [];
  let row: string[] = [];
  let field = "";
  let quoted = false;
  let started = false;
  for (let i = 0; i < text.length; i++) {
    const char = text[i];
    if (quoted) {
      if (char === '"' && text[i + 1] === '"') {
        field += '"';
        i++;
      } else if (char === '"') {
        quoted = false;
      } else {
        field += char;
      }
    } else if (char === '"') {
      quoted = true;
      started = true;
    } else if (char === ",") {
      row.push(field);
      field = "";
      started = true;
    } else if (char === "\n" || char === "\r") {
      if (started || field !== "") {
        row.push(field);
        rows.push(row);
      }
      row = [];
      field = "";
      started = false;
    } else {
      field += char;
      started = true;
    }
  }
  if (started || field !== "") {
    row.push(field);
    rows.push(row);
  }
  return rows;
}

/**
 * The kernels of an `ncu --csv --page details` listing (lines before the CSV header, such as
 * `==PROF==` messages, are skipped).
 *
 * @example
 * ```ts
 * import { parseNcuDetails } from "./profile_summary.ts";
 *
 * const csv = [
 *   '"ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit","Metric Value"',
 *   '"0","add_one","(256, 1, 1)","(4096, 1, 1)","GPU Speed Of Light Throughput","Duration","us","5.12"',
 * ].join("\n");
 * const [kernel] = parseNcuDetails(csv);
 * if (kernel.name !== "add_one" || kernel.metrics.Duration !== "5.12 us") throw new Error();
 * ```
 */
export function parseNcuDetails(csv: string): NcuKernel[] {
  const rows = parseCsv(csv);
  const headerAt = rows.findIndex((row) => row.includes("Metric Name") && row.includes("ID"));
  if (headerAt === -1) return [];
  const header = rows[headerAt];
  const column = (name: string) => header.indexOf(name);
  const [id, name, block, grid, metric, unit, value] = [
    "ID",
    "Kernel Name",
    "Block Size",
    "Grid Size",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
  ].map(column);
  const kernels = new Map<string, NcuKernel>();
  for (const row of rows.slice(headerAt + 1)) {
    // Metric rows stop after `Metric Value` (a trailing empty field); rule rows go on.
    if (row.length <= Math.max(id, name, metric, value)) continue;
    const key = row[id];
    let kernel = kernels.get(key);
    if (kernel === undefined) {
      kernel = {
        id: key,
        name: name >= 0 ? row[name] : "?",
        grid: grid >= 0 ? row[grid] : "?",
        block: block >= 0 ? row[block] : "?",
        metrics: {},
      };
      kernels.set(key, kernel);
    }
    const metricName = row[metric];
    if (NCU_HEADLINE_METRICS.includes(metricName) && !(metricName in kernel.metrics)) {
      const shown = unit >= 0 && row[unit] ? `${row[value]} ${row[unit]}` : row[value];
      kernel.metrics[metricName] = shown;
    }
  }
  return [...kernels.values()];
}

/**
 * One line per kernel: `#ID NAME grid G block B: Duration 5.12 us, ...` (at most `limit`
 * kernels, then how many more).
 *
 * @example
 * ```ts
 * import { summarizeNcuKernels } from "./profile_summary.ts";
 *
 * const text = summarizeNcuKernels([{ id: "0", name: "add_one", grid: "(4096, 1, 1)",
 *   block: "(256, 1, 1)", metrics: { Duration: "5.12 us" } }]);
 * if (text !== "#0 add_one grid (4096, 1, 1) block (256, 1, 1): Duration 5.12 us") throw new Error(text);
 * ```
 */
export function summarizeNcuKernels(kernels: readonly NcuKernel[], limit = 20): string {
  if (kernels.length === 0) return "no kernel was profiled";
  const lines = kernels.slice(0, limit).map((kernel) => {
    const metrics = NCU_HEADLINE_METRICS.filter((name) => name in kernel.metrics)
      .map((name) => `${name} ${kernel.metrics[name]}`).join(", ");
    return `#${kernel.id} ${kernel.name} grid ${kernel.grid} block ${kernel.block}: ${
      metrics || "no headline metric"
    }`;
  });
  if (kernels.length > limit) lines.push(`... ${kernels.length - limit} more kernels`);
  return lines.join("\n");
}

/** What a Compute Sanitizer log says. */
export interface SanitizerSummary {
  /** The `ERROR SUMMARY` count; null when the log has none (the run did not finish). */
  errors: number | null;
  /** The summary line and the first findings. */
  text: string;
}

/**
 * The error count and first findings of a Compute Sanitizer log (`=========`-prefixed lines).
 *
 * @example
 * ```ts
 * import { summarizeSanitizerLog } from "./profile_summary.ts";
 *
 * const log = "========= COMPUTE-SANITIZER\n" +
 *   "========= Invalid __global__ write of size 4 bytes\n=========     at oob(int *)+0x70\n" +
 *   "=========\n========= ERROR SUMMARY: 1 error\n";
 * const summary = summarizeSanitizerLog(log);
 * if (summary.errors !== 1 || !summary.text.startsWith("ERROR SUMMARY: 1 error\n")) throw new Error();
 * ```
 */
export function summarizeSanitizerLog(log: string, limit = 20): SanitizerSummary {
  const lines = log.split("\n").filter((line) => line.startsWith("========="))
    .map((line) => line.replace(/^=========\s?/, "").trimEnd());
  const summary = lines.find((line) => /^ERROR SUMMARY: \d+ error/.test(line));
  const errors = summary === undefined ? null : Number(/(\d+)/.exec(summary)![1]);
  const findings = lines.filter((line) =>
    line !== "" && line !== summary && line !== "COMPUTE-SANITIZER"
  );
  const shown = findings.slice(0, limit);
  if (findings.length > limit) shown.push(`... ${findings.length - limit} more lines`);
  const head = summary ?? "no ERROR SUMMARY in the log (the application did not finish?)";
  return { errors, text: [head, ...shown].join("\n") };
}
