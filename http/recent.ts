/**
 * The last few records of one event, kept for a status page: a ring of at most `size` picked fields
 * (never program sources, outputs or tokens: only what `pick` takes).
 *
 * @module
 */

/** A bounded list of the newest entries. */
export class Recent<T> {
  readonly #size: number;
  readonly #pick: (record: Record<string, unknown>) => T;
  #items: T[] = [];

  /** Keeps at most `size` entries made by `pick`. */
  constructor(size: number, pick: (record: Record<string, unknown>) => T) {
    this.#size = size;
    this.#pick = pick;
  }

  /** Adds one record. */
  add(record: Record<string, unknown>): void {
    this.#items.push(this.#pick(record));
    if (this.#items.length > this.#size) this.#items.shift();
  }

  /** The entries, newest first. */
  list(): T[] {
    return [...this.#items].reverse();
  }
}

/** A record field that should be a number, or `null` (for the picked entries of a status page). */
export function numberOrNull(value: unknown): number | null {
  return typeof value === "number" ? value : null;
}

/** A record field that should be a string, or `null`. */
export function stringOrNull(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}
