/**
 * Progress while `kcoral run` waits for its response: elapsed time, and whether the
 * request is probably queued or running, guessed from the server's `GET /health` load
 * counters polled about once a second. The guess is a hint: the counters cover every
 * client of the server, and a router or an older server may not report them.
 *
 * @module
 */

import { formatElapsed, type Progress } from "./progress.ts";

/** The `load` counters of `GET /health`. */
export interface ServerLoad {
  /** Requests the server can run at once. */
  requestCapacity: number;
  /** Requests running now. */
  requestsInProgress: number;
  /** Requests waiting for a worker. */
  requestsWaiting: number;
}

/**
 * The `load` counters of a `GET /health` body, or `null` when it has none.
 *
 * @example
 * ```ts
 * import { parseLoad } from "./watch.ts";
 * parseLoad({ status: "ok", load: { request_capacity: 1, requests_in_progress: 1, requests_waiting: 2 } });
 * // { requestCapacity: 1, requestsInProgress: 1, requestsWaiting: 2 }
 * parseLoad({ status: "ok" }); // null
 * ```
 */
export function parseLoad(health: unknown): ServerLoad | null {
  if (typeof health !== "object" || health === null) return null;
  const load = (health as Record<string, unknown>).load;
  if (typeof load !== "object" || load === null) return null;
  const field = (name: string) => {
    const value = (load as Record<string, unknown>)[name];
    return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : null;
  };
  const requestCapacity = field("request_capacity");
  const requestsInProgress = field("requests_in_progress");
  const requestsWaiting = field("requests_waiting");
  if (requestCapacity === null || requestsInProgress === null || requestsWaiting === null) {
    return null;
  }
  return { requestCapacity, requestsInProgress, requestsWaiting };
}

/**
 * The waiting line. Unknown load: `waiting for the server`; requests waiting: `queued`;
 * requests running: `running`; nothing accepted yet: `sending request` (the body is
 * still being uploaded or read).
 *
 * @example
 * ```ts
 * import { describeWait } from "./watch.ts";
 * describeWait(3_200, { requestCapacity: 1, requestsInProgress: 1, requestsWaiting: 0 });
 * // "kcoral: running, 3 s"
 * describeWait(61_000, { requestCapacity: 1, requestsInProgress: 1, requestsWaiting: 2 });
 * // "kcoral: queued, 1 min 01 s (2 requests waiting)"
 * ```
 */
export function describeWait(elapsedMs: number, load: ServerLoad | null): string {
  const elapsed = formatElapsed(elapsedMs);
  if (load === null) return `kcoral: waiting for the server, ${elapsed}`;
  if (load.requestsWaiting > 0) {
    const count = load.requestsWaiting;
    return `kcoral: queued, ${elapsed} (${count} request${count === 1 ? "" : "s"} waiting)`;
  }
  if (load.requestsInProgress > 0) return `kcoral: running, ${elapsed}`;
  return `kcoral: sending request, ${elapsed}`;
}

/** Options of {@linkcode watchWaiting}. */
export interface WatchOptions {
  /** Where the line is shown (a disabled display makes this a no-op). */
  progress: Progress;
  /** Fetches `GET /health` (its body); a rejection means "unknown". */
  health: () => Promise<unknown>;
  /** Time between polls and re-renders, in milliseconds (default 1000). */
  intervalMs?: number;
  /** Clock in milliseconds (default `Date.now`). */
  now?: () => number;
  /** Consecutive failed polls after which polling stops (default 3). */
  maxFailures?: number;
  /** While this says true (bytes are moving: another line shows them), nothing is rendered. */
  paused?: () => boolean;
}

/** A running {@linkcode watchWaiting}. */
export interface Watch {
  /** Stop rendering and polling; resolves when the poll loop has ended. */
  stop(): Promise<void>;
}

/**
 * Show the waiting line now and refresh it every `intervalMs`, polling the server's load
 * between refreshes. Nothing is started when the display is disabled.
 *
 * @example
 * ```ts
 * import { Progress } from "./progress.ts";
 * import { watchWaiting } from "./watch.ts";
 * let shown = "";
 * const progress = new Progress({ write: (text) => shown += text, isTerminal: true });
 * const watch = watchWaiting({ progress, health: () => Promise.resolve({}), intervalMs: 10 });
 * await watch.stop();
 * shown.startsWith("\rkcoral: waiting for the server, 0 s"); // true
 * ```
 */
export function watchWaiting(options: WatchOptions): Watch {
  const { progress, health } = options;
  if (!progress.enabled) return { stop: () => Promise.resolve() };
  const intervalMs = options.intervalMs ?? 1000;
  const now = options.now ?? Date.now;
  const maxFailures = options.maxFailures ?? 3;
  const start = now();
  const stopping = new AbortController();
  let load: ServerLoad | null = null;
  const render = () => {
    if (!options.paused?.()) progress.update(describeWait(now() - start, load), { force: true });
  };
  render();
  const timer = setInterval(render, intervalMs);
  const loop = (async () => {
    let failures = 0;
    while (!stopping.signal.aborted && failures < maxFailures) {
      try {
        load = parseLoad(await health());
        failures = load === null ? failures + 1 : 0;
      } catch {
        load = null;
        failures++;
      }
      if (stopping.signal.aborted) break;
      render();
      await _sleep(intervalMs, stopping.signal);
    }
  })();
  return {
    async stop() {
      stopping.abort();
      clearInterval(timer);
      await loop;
    },
  };
}

function _sleep(milliseconds: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, milliseconds);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
