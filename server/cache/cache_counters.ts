/**
 * What a cache counts for the operator's metrics (`GET /metrics`): lookups that found the
 * object, lookups that did not, and objects evicted to stay within capacity. Plain numbers
 * bumped where the event happens; the metrics module reads them when scraped.
 *
 * @example
 * ```ts
 * import { CacheCounters } from "./cache_counters.ts";
 *
 * const counters = new CacheCounters();
 * counters.hits++;
 * counters.evictions += 2;
 * if (counters.hits !== 1 || counters.misses !== 0 || counters.evictions !== 2) throw new Error();
 * ```
 *
 * @module
 */

/** A cache's running counts since the server started. */
export class CacheCounters {
  /** Lookups that found the object. */
  hits = 0;
  /** Lookups that did not (the client is asked for it, or it is written anew). */
  misses = 0;
  /** Objects removed to stay within capacity. */
  evictions = 0;
}
