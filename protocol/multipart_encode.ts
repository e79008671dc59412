/**
 * Multipart/form-data encoding (spec protocol §3.3), behaving like upstream `encode_multipart`,
 * with its messages: random boundaries checked against every payload, part headers, and whole
 * bodies or their ordered chunks. Parsing is in `multipart_parse.ts`.
 *
 * @module
 */

import { concatBytes } from "./bytes.ts";
import { DelimiterFinder } from "./bytes_search.ts";
import { boundaryBytes, MultipartError } from "./multipart_parse.ts";

const _encoder = new TextEncoder();

/** A fresh random boundary: `kcoral-` + 32 lowercase hex digits (128 random bits). */
export function newBoundary(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let hex = "";
  for (const byte of bytes) hex += byte.toString(16).padStart(2, "0");
  return "kcoral-" + hex;
}

function _delimiterFinder(boundary: string): DelimiterFinder {
  const marker = boundaryBytes("\r\n--" + boundary);
  return new DelimiterFinder(marker);
}

/**
 * Whether `CRLF--boundary` occurs in `payload` (such a payload would end its part early, so the
 * boundary must be re-drawn).
 */
export function boundaryOccursIn(payload: Uint8Array, boundary: string): boolean {
  return _delimiterFinder(boundary).find(payload, 0) >= 0;
}

function _checkHeaderText(value: string, what: string): void {
  if (value === "" || /[\r\n"]/.test(value) || !/^[\x20-\x7e]*$/.test(value)) {
    throw new MultipartError(`invalid multipart ${what}: ${JSON.stringify(value)}`);
  }
}

/**
 * The bytes that open one part: `--B CRLF Content-Disposition: form-data; name="N" CRLF
 * Content-Type: T CRLF CRLF`. Write the payload and then {@linkcode PART_SEPARATOR} after it; end
 * the body with {@linkcode closingDelimiter}.
 */
export function partHeader(
  boundary: string,
  name: string,
  contentType: string,
): Uint8Array<ArrayBuffer> {
  _checkHeaderText(boundary, "boundary");
  _checkHeaderText(name, "part name");
  _checkHeaderText(contentType, "content type");
  return _encoder.encode(
    `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n` +
      `Content-Type: ${contentType}\r\n\r\n`,
  );
}

/** `CRLF`, written after every part payload (shared: do not modify). */
export const PART_SEPARATOR: Uint8Array<ArrayBuffer> = new Uint8Array([0x0d, 0x0a]);

/** `--B--` CRLF, the closing delimiter that ends a body. */
export function closingDelimiter(boundary: string): Uint8Array<ArrayBuffer> {
  _checkHeaderText(boundary, "boundary");
  return _encoder.encode(`--${boundary}--\r\n`);
}

/** A part to encode. */
export interface MultipartInput {
  /** Form field name (ASCII, no quote, CR or LF). */
  name: string;
  /** Content-Type header value, e.g. `application/octet-stream`. */
  contentType: string;
  /** The payload. */
  body: Uint8Array;
}

/** An encoded multipart body. */
export interface EncodedMultipart {
  /** `multipart/form-data; boundary=<boundary>`. */
  contentType: string;
  /** The whole body (its own `ArrayBuffer`, usable as a fetch/Response body). */
  body: Uint8Array<ArrayBuffer>;
}

/**
 * Encode parts as upstream does (spec §3.3): `--B CRLF` headers `CRLF CRLF` payload `CRLF` per
 * part, then `--B-- CRLF`. The body is one allocation filled with `TypedArray.set`. Without
 * `boundary`, random `kcoral-<hex>` boundaries are drawn until `CRLF--B` occurs in no payload; a
 * given `boundary` that occurs in a payload is a `MultipartError`.
 */
export function encodeMultipart(
  parts: readonly MultipartInput[],
  boundary?: string,
): EncodedMultipart {
  const { contentType, chunks } = encodeMultipartChunks(parts, boundary);
  return { contentType, body: concatBytes(chunks) };
}

/** A multipart body as the ordered list of its pieces (payloads are not copied). */
export interface MultipartChunks {
  /** `multipart/form-data; boundary=...`. */
  contentType: string;
  /** Headers, payloads (the callers' own arrays), separators and the closing delimiter. */
  chunks: Uint8Array<ArrayBuffer>[];
  /** Total byte length. */
  length: number;
}

/**
 * Like {@linkcode encodeMultipart} but without joining: the body is `chunks` in order, so a large
 * body can be streamed without a second copy of its payloads. A given `boundary` is checked against
 * every payload except those in `scanned` (payloads the caller already knows it does not occur in).
 */
export function encodeMultipartChunks(
  parts: readonly MultipartInput[],
  boundary?: string,
  options: { scanned?: ReadonlySet<Uint8Array> } = {},
): MultipartChunks {
  if (parts.length === 0) throw new MultipartError("at least one multipart part is required");
  if (boundary !== undefined) {
    const finder = _delimiterFinder(boundary);
    const scanned = options.scanned;
    if (parts.some((part) => !scanned?.has(part.body) && finder.find(part.body, 0) >= 0)) {
      throw new MultipartError("the boundary occurs in a part payload");
    }
  } else {
    do boundary = newBoundary(); while (_occursInAny(parts, boundary));
  }
  const chunks: Uint8Array<ArrayBuffer>[] = [];
  let length = 0;
  const push = (chunk: Uint8Array<ArrayBuffer>) => {
    chunks.push(chunk);
    length += chunk.length;
  };
  for (const part of parts) {
    push(partHeader(boundary, part.name, part.contentType));
    push(part.body as Uint8Array<ArrayBuffer>);
    push(PART_SEPARATOR);
  }
  push(closingDelimiter(boundary));
  return { contentType: `multipart/form-data; boundary=${boundary}`, chunks, length };
}

function _occursInAny(parts: readonly MultipartInput[], boundary: string): boolean {
  const finder = _delimiterFinder(boundary);
  return parts.some((part) => finder.find(part.body, 0) >= 0);
}
