/**
 * Python `str` semantics on JavaScript's UTF-16 strings: ordering by code points (Python's
 * `sorted()` of strings) and code-point indices (the positions Python's error messages count in).
 *
 * @module
 */

/** Compare two strings by Unicode code points, as Python does. */
export function comparePy(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  if (i === n) return a.length - b.length;
  // Step back onto a shared high surrogate so both sides read whole code points.
  if (i > 0) {
    const previous = a.charCodeAt(i - 1);
    if (previous >= 0xd800 && previous <= 0xdbff) i--;
  }
  return (a.codePointAt(i) as number) - (b.codePointAt(i) as number);
}

/** `sorted(strings)` with Python's code-point order. */
export function pySorted(items: Iterable<string>): string[] {
  return [...items].sort(comparePy);
}

/** Number of code points in `s.slice(0, end)` (Python string index of `end`). */
export function codePointIndex(s: string, end: number): number {
  let count = 0;
  for (let i = 0; i < end; i++) {
    const code = s.charCodeAt(i);
    if (code >= 0xd800 && code <= 0xdbff && i + 1 < end) {
      const low = s.charCodeAt(i + 1);
      if (low >= 0xdc00 && low <= 0xdfff) i++;
    }
    count++;
  }
  return count;
}
