/**
 * Kept returns, an opt-in extension of `POST /execute` (docs/kept-returns.md): with
 * `X-KCoral-Keep-Returns: <n>` the server keeps every returned `bytes` or tensor value of at least
 * `n` bytes in its blob cache and answers a `kept` node instead
 * (`{"type":"kept","kind":"bytes"|"tensor","sha256":...,"size":N[,"dtype","shape"]}`), which a
 * later program uploads by hash. Without the header nothing changes.
 *
 * @module
 */

/** The request header that asks for kept returns; its value is the least size kept, in bytes. */
export const KEEP_RETURNS_HEADER = "x-kcoral-keep-returns";

/**
 * The least size of a kept return that `headers` ask for: `null` without the header; a `RangeError`
 * naming the header for a value that is not a decimal byte count.
 */
export function keptReturnsMinBytes(headers: Headers): number | null {
  const value = headers.get(KEEP_RETURNS_HEADER);
  if (value === null) return null;
  const text = value.trim();
  const bytes = Number(text);
  if (!/^[0-9]{1,16}$/.test(text) || !Number.isSafeInteger(bytes)) {
    throw new RangeError(
      `X-KCoral-Keep-Returns must be the least size of a kept return in bytes (a decimal ` +
        `integer), not ${JSON.stringify(value.slice(0, 64))}`,
    );
  }
  return bytes;
}

/** A returned value the server kept in its blob cache (a `kept` result node, decoded). */
export interface KeptNode {
  /** What it is: `bytes`, or a tensor with {@linkcode dtype} and {@linkcode shape}. */
  kind: "bytes" | "tensor";
  /** The SHA-256 the server cached it under (lowercase hex). */
  sha256: string;
  /** Its size in bytes. */
  size: number;
  /** A tensor's dtype. */
  dtype?: string;
  /** A tensor's shape. */
  shape?: number[];
}
