/**
 * {@linkcode JsonFloat}: a JSON number spelled as a float, kept apart from integers as Python's
 * `json` module keeps `float` apart from `int`.
 *
 * @module
 */

/**
 * A JSON number that was spelled as a float (with a fraction or an exponent), kept distinct from
 * integers the way Python's `json` module keeps `float` apart from `int`.
 *
 * {@linkcode parseJsonTyped} produces it; {@linkcode stringifyJson} writes it with Python's float
 * spelling (`30.0`, `1e+16`).
 *
 * @example Keep "30.0" a float on the wire
 * ```ts
 * import { JsonFloat, stringifyJson } from "./mod.ts";
 *
 * if (stringifyJson([new JsonFloat(30), 30]) !== "[30.0,30]") throw new Error();
 * ```
 */
export class JsonFloat {
  /** The numeric value (may be ±Infinity for spellings such as `1e400`). */
  readonly value: number;

  /** Wrap a number that must be treated (and written) as a float. */
  constructor(value: number) {
    this.value = value;
  }

  /** The numeric value, so arithmetic on a `JsonFloat` works. */
  valueOf(): number {
    return this.value;
  }
}
