/**
 * What the server's and the Router's `GET /metrics` share: the exposition format's content type,
 * the duration buckets of their histograms, the build and process metrics, and the response.
 *
 * @module
 */
import { collectDefaultMetrics, Gauge, type Metric, Registry } from "prom-client";
import { KCORAL_VERSION } from "../options/version.ts";

/** The `Content-Type` of the Prometheus text exposition format. */
const _METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

/** Buckets for waits and holds, in seconds: sub-millisecond up to the longest timeout. */
export const DURATION_BUCKETS: readonly number[] = [
  0.0005,
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
  300,
  900,
  1800,
];

/** `registry` in the exposition format, as a `200` response. */
export async function metricsResponse(registry: Registry): Promise<Response> {
  const text = await registry.metrics();
  return new Response(text, { headers: { "content-type": _METRICS_CONTENT_TYPE } });
}

/**
 * Registers what every KCoral process exposes besides its own metrics:
 * `kcoral_build_info{version,deno,…} 1` (the labels of `extraLabels()` as well, read when scraped)
 * and prom-client's `process_*` metrics (CPU seconds, resident memory, open and maximum file
 * descriptors, start time), which read `/proc/self` under Deno as under Node. prom-client's
 * `nodejs_*` metrics are left out: under Deno its event-loop monitor reports nothing real.
 */
export function registerProcessMetrics(
  registry: Registry,
  extraLabels: () => Record<string, string> = () => ({}),
  extraLabelNames: readonly string[] = [],
): void {
  for (const metric of _processMetrics()) registry.registerMetric(metric);
  new Gauge({
    name: "kcoral_build_info",
    help: "1, labelled with the KCoral version and the runtime versions it runs on.",
    labelNames: ["version", "deno", ...extraLabelNames],
    registers: [registry],
    collect() {
      this.reset();
      const extra = extraLabels();
      const labels: Record<string, string> = { version: KCORAL_VERSION, deno: Deno.version.deno };
      for (const name of extraLabelNames) labels[name] = extra[name] ?? "";
      this.set(labels, 1);
    },
  });
}

let _shared: Metric[] | null = null;

/** prom-client's `process_*` metrics, made once per process (they describe the process). */
function _processMetrics(): Metric[] {
  if (_shared) return _shared;
  const scratch = new Registry();
  collectDefaultMetrics({ register: scratch });
  const names = scratch.getMetricsAsArray().map((metric) => metric.name);
  const process = names.filter((name) => name.startsWith("process_"));
  return _shared = process.map((name) => scratch.getSingleMetric(name)!);
}
