/**
 * The `GET /health` body (spec protocol §1.1), declared once for the server that sends it, the
 * router that aggregates it and the client that reads it.
 *
 * @module
 */

/**
 * The `load` object of a `/health` body: how busy the server (or, for a router, all of its nodes
 * together) is.
 *
 * @example
 * ```ts
 * import type { HealthLoad } from "./health.ts";
 *
 * function saturated(load: HealthLoad): boolean {
 *   return load.requests_in_progress >= load.request_capacity && load.requests_waiting > 0;
 * }
 * ```
 */
export interface HealthLoad {
  /** Workers able to take requests. */
  request_capacity: number;
  /** Requests holding a worker. */
  requests_in_progress: number;
  /** Requests waiting for a worker. */
  requests_waiting: number;
}

/**
 * The `/health` body (spec protocol §1.1).
 *
 * @example
 * ```ts
 * import type { HealthBody } from "./health.ts";
 *
 * const body: HealthBody = {
 *   status: "ok",
 *   instance_id: crypto.randomUUID(),
 *   started_at: "2026-05-01T09:00:00.123000Z",
 *   gpu_count: 0,
 *   load: { request_capacity: 2, requests_in_progress: 0, requests_waiting: 0 },
 *   target: {},
 *   versions: { python: "3.12.3" },
 * };
 * ```
 */
export interface HealthBody {
  /** Always `"ok"` while the application is up. */
  status: "ok";
  /** Random UUID of this server process. */
  instance_id: string;
  /** UTC start time, e.g. `2026-05-01T09:00:00.123000Z`. */
  started_at: string;
  /** Distinct configured GPUs (0 on a CPU server). */
  gpu_count: number;
  /** Workers able to take requests, requests holding a worker, requests waiting for one. */
  load: HealthLoad;
  /** Compilation target (`{"arch": "sm_90a"}`), `{}` on CPU servers. */
  target: Record<string, string>;
  /** Versions the workers run (torch, cuda, ...). */
  versions: Record<string, string>;
}

/**
 * A Router's `/health` body (spec router §2.5): a server's shape, with `status` `"unavailable"`
 * (and HTTP 503) while no ready node has a slot, `gpu_count` always `null`, `load` summed over the
 * nodes, and `target`/`versions` the pool's baseline.
 *
 * @example
 * ```ts
 * import type { RouterHealthBody } from "./health.ts";
 *
 * const body: RouterHealthBody = {
 *   status: "unavailable",
 *   instance_id: crypto.randomUUID(),
 *   started_at: "2026-05-01T09:00:00.123000Z",
 *   gpu_count: null,
 *   load: { request_capacity: 0, requests_in_progress: 0, requests_waiting: 0 },
 *   target: {},
 *   versions: {},
 * };
 * ```
 */
export interface RouterHealthBody extends Omit<HealthBody, "status" | "gpu_count"> {
  /** `"ok"` when some ready node has a slot. */
  status: "ok" | "unavailable";
  /** Always `null` on a Router. */
  gpu_count: null;
}
