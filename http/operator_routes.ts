/**
 * The routes an operator reads, the same on a server and a Router: `GET /metrics` (a registry in
 * the Prometheus exposition format), `GET /status` (the live page) and `GET /status/data` (the
 * page's data as JSON). All three need a client token when tokens are set.
 *
 * @module
 */
import type { Registry } from "prom-client";
import { metricsResponse } from "./metrics_response.ts";
import { jsonResponse, type Route } from "./routes.ts";
import { statusPageResponse } from "./status_page.ts";

/** The three operator routes over `metrics` and the page data `statusData()` gives. */
export function operatorRoutes(metrics: Registry, statusData: () => unknown): Route[] {
  return [
    {
      path: "/metrics",
      methods: ["GET"],
      access: "client",
      handler: () => metricsResponse(metrics),
    },
    {
      path: "/status",
      methods: ["GET"],
      access: "client",
      handler: () => statusPageResponse(),
    },
    {
      path: "/status/data",
      methods: ["GET"],
      access: "client",
      handler: () => jsonResponse(200, JSON.stringify(statusData())),
    },
  ];
}
