/** Small statistics and table helpers for the benchmarks. */
import type { BenchRow } from "./codec_bench.ts";

export type { BenchRow };

/** Median, min and max of samples (NaN for none). */
export function summarize(samples: number[]): { median: number; min: number; max: number } {
  if (samples.length === 0) return { median: NaN, min: NaN, max: NaN };
  const sorted = [...samples].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const median = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  return { median, min: sorted[0], max: sorted[sorted.length - 1] };
}

/** A row from samples. */
export function row(
  name: string,
  unit: string,
  samples: number[],
  upstream?: string,
  target?: string,
): BenchRow & { target?: string } {
  return { name, unit, ...summarize(samples), upstream, target };
}

/** Formats rows as a Markdown table. */
export function table(rows: (BenchRow & { target?: string })[]): string {
  const fmt = (n: number) =>
    Number.isNaN(n)
      ? "n/a"
      : Math.abs(n) >= 100
      ? n.toFixed(0)
      : Math.abs(n) >= 10
      ? n.toFixed(1)
      : n.toFixed(2);
  const lines = [
    "| metric | unit | median | min | max | upstream | target |",
    "|---|---|---|---|---|---|---|",
  ];
  for (const r of rows) {
    lines.push(
      `| ${r.name} | ${r.unit} | ${fmt(r.median)} | ${fmt(r.min)} | ${fmt(r.max)} | ${
        r.upstream ?? ""
      } | ${r.target ?? ""} |`,
    );
  }
  return lines.join("\n");
}
