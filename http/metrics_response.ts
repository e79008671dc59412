/**
 * What the server's and the Router's `GET /metrics` share: the exposition format's content type,
 * the duration buckets of their histograms, and the response itself.
 *
 * @example
 * ```ts
 * import { Counter, Registry } from "prom-client";
 * import { metricsResponse } from "./metrics_response.ts";
 *
 * const registry = new Registry();
 * new Counter({ name: "kcoral_example_total", help: "An example.", registers: [registry] }).inc();
 * const response = await metricsResponse(registry);
 * if (!(await response.text()).includes("kcoral_example_total 1")) throw new Error();
 * ```
 *
 * @module
 */
import type { Registry } from "prom-client";

/** The `Content-Type` of the Prometheus text exposition format. */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

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
  return new Response(text, { headers: { "content-type": METRICS_CONTENT_TYPE } });
}
