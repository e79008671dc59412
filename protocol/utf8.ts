/**
 * Strict UTF-8 decoding at the lenient decoder's speed (a fatal `TextDecoder` is ~3x slower,
 * docs/decisions/router-trivial-latency.md): only text holding U+FFFD after the lenient decode is
 * decoded again strictly, so results and errors are the strict decoder's.
 *
 * @module
 */

const _lenient = new TextDecoder("utf-8");
const _lenientKeepingBom = new TextDecoder("utf-8", { ignoreBOM: true });
const _strict = new TextDecoder("utf-8", { fatal: true });
const _strictKeepingBom = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** How to decode. */
export interface DecodeUtf8Options {
  /** Keep a leading byte order mark as U+FEFF (default: dropped, as `TextDecoder` does). */
  keepBom?: boolean;
}

/**
 * `bytes` as text, exactly as `new TextDecoder("utf-8", { fatal: true })` (with `ignoreBOM` when
 * `keepBom`) decodes them: a `TypeError` for bytes that are not UTF-8.
 */
export function decodeUtf8(bytes: Uint8Array, options: DecodeUtf8Options = {}): string {
  const keepBom = options.keepBom === true;
  const text = (keepBom ? _lenientKeepingBom : _lenient).decode(bytes);
  if (!text.includes("\uFFFD")) return text;
  return (keepBom ? _strictKeepingBom : _strict).decode(bytes);
}
