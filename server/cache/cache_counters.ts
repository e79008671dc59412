/**
 * What a cache counts for `GET /metrics`: hits, misses and evictions, bumped where they happen.
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
