/**
 * Kept returns, an opt-in extension of `POST /execute` (docs/kept-returns.md). A request with
 * `X-KCoral-Keep-Returns: <n>` asks the server to keep every `bytes` and tensor value of at
 * least `n` bytes that the program returns in its blob cache instead of sending it. Such a value
 * comes back as a `kept` node with no part:
 *
 * ```
 * {"type":"kept","kind":"bytes","sha256":"<64 hex>","size":N}
 * {"type":"kept","kind":"tensor","sha256":"<64 hex>","size":N,"dtype":"float32","shape":[...]}
 * ```
 *
 * The server hashed the bytes itself before it cached them under that SHA-256, so a later
 * program names the value as an ordinary blob (`{"op":"upload","kind":"bytes","blob":...}`)
 * and sends no bytes; a server that has dropped it since answers `CACHE_MISS` as for any blob.
 * A value the server cannot keep (over its share of the cache) is sent as usual, and a server
 * that does not know the header (upstream) sends everything: without the header nothing
 * changes.
 *
 * @module
 */

/** The request header that asks for kept returns; its value is the least size kept, in bytes. */
export const KEEP_RETURNS_HEADER = "x-kcoral-keep-returns";

/**
 * The least size of a kept return that `headers` ask for: `null` without the header; a
 * `RangeError` naming the header for a value that is not a decimal byte count.
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
