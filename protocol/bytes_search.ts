/**
 * Fast search for a byte pattern in a large buffer (a multipart delimiter, the end of an HTTP
 * head): Horspool's scan keyed on the pattern's last byte plus a check of its first, linear time on
 * any input.
 *
 * @module
 */

/**
 * Finds a byte pattern (Horspool's skip table), e.g. a multipart delimiter `CRLF--boundary` in a
 * large payload, at memory-scan speed from JavaScript.
 */
export class DelimiterFinder {
  /** The bytes searched for. */
  readonly pattern: Uint8Array;
  readonly #skip: Int32Array;

  /** A finder for `pattern` (at least 2 bytes). */
  constructor(pattern: Uint8Array) {
    if (pattern.length < 2) throw new RangeError("the pattern needs at least 2 bytes");
    this.pattern = pattern;
    const m = pattern.length;
    this.#skip = new Int32Array(256).fill(m);
    for (let k = 0; k < m - 1; k++) this.#skip[pattern[k]] = m - 1 - k;
  }

  /**
   * First index ≥ `from` where the pattern occurs, or -1. The pattern's first byte must not occur
   * elsewhere in it (true for CR/LF-led delimiters), which bounds the verification work by the body
   * length.
   */
  find(hay: Uint8Array, from: number): number {
    const pattern = this.pattern;
    const skip = this.#skip;
    const m = pattern.length;
    const n = hay.length;
    const first = pattern[0];
    const last = pattern[m - 1];
    let i = from + m - 1;
    while (i < n) {
      const c = hay[i];
      if (c === last && hay[i - m + 1] === first) {
        let k = 1;
        let j = i - m + 2;
        while (k < m - 1 && hay[j] === pattern[k]) {
          k++;
          j++;
        }
        if (k >= m - 1) return i - m + 1;
      }
      i += skip[c];
    }
    return -1;
  }
}
