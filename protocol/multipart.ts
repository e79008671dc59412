/**
 * Strict multipart/form-data framing (spec protocol §2.1, §3.3), behaving
 * like upstream `parse_multipart`/`encode_multipart`, with its messages.
 *
 * Speed: bodies reach 256 MiB. Delimiters are found with a Horspool scan
 * ({@linkcode DelimiterFinder}, keyed on the delimiter's last byte plus a
 * check of its first byte, which occurs nowhere else in it), so random or
 * all-zero payloads are skipped about one delimiter length at a time and no
 * input costs more than linear time. Parts are returned as subarray views;
 * nothing is copied.
 *
 * @module
 */

import { concatBytes } from "./bytes.ts";
import { DelimiterFinder } from "./bytes_search.ts";

/** One part of a multipart body. */
export interface MultipartPart {
  /** The `name` parameter of `Content-Disposition`. */
  name: string;
  /** `type/subtype` of `Content-Type`, lowercased, parameters dropped. */
  mediaType: string;
  /** The payload: a view into the parsed body (no copy). */
  body: Uint8Array;
}

/** Malformed multipart framing; `message` is upstream's 400 text. */
export class MultipartError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string) {
    super(message);
    this.name = "MultipartError";
  }
}

const _encoder = new TextEncoder();

// RFC 2045 token characters (printable ASCII except tspecials and space).
const _TOKEN = /^[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+$/;

interface _ParamHeader {
  value: string;
  params: [string, string][];
}

/** Parse `value *( ";" name "=" (token | quoted-string) )`; null when malformed. */
function _parseParamHeader(header: string, mediaType: boolean): _ParamHeader | null {
  const pieces: string[] = [];
  // Split on ';' outside quoted strings.
  let current = "";
  let quoted = false;
  for (let i = 0; i < header.length; i++) {
    const c = header[i];
    if (quoted) {
      current += c;
      if (c === "\\") {
        if (i + 1 >= header.length) return null;
        current += header[++i];
      } else if (c === '"') quoted = false;
    } else if (c === '"') {
      quoted = true;
      current += c;
    } else if (c === ";") {
      pieces.push(current);
      current = "";
    } else current += c;
  }
  if (quoted) return null;
  pieces.push(current);
  const value = pieces[0].trim();
  if (mediaType) {
    const slash = value.indexOf("/");
    if (slash < 0 || !_TOKEN.test(value.slice(0, slash)) || !_TOKEN.test(value.slice(slash + 1))) {
      return null;
    }
  } else if (!_TOKEN.test(value)) return null;
  const params: [string, string][] = [];
  for (let k = 1; k < pieces.length; k++) {
    const piece = pieces[k].trim();
    if (piece === "" && k === pieces.length - 1) break; // a trailing ';'
    const eq = piece.indexOf("=");
    if (eq <= 0) return null;
    const name = piece.slice(0, eq).trim();
    let raw = piece.slice(eq + 1).trim();
    if (!_TOKEN.test(name)) return null;
    if (raw.startsWith('"')) {
      const unquoted = _unquote(raw);
      if (unquoted === null) return null;
      raw = unquoted;
    } else if (!_TOKEN.test(raw)) return null;
    params.push([name.toLowerCase(), raw]);
  }
  return { value: value.toLowerCase(), params };
}

/** The content of a quoted-string spanning all of `raw`, or null. */
function _unquote(raw: string): string | null {
  let out = "";
  for (let i = 1; i < raw.length; i++) {
    const c = raw[i];
    if (c === "\\") {
      if (i + 1 >= raw.length) return null;
      out += raw[++i];
    } else if (c === '"') return i === raw.length - 1 ? out : null;
    else out += c;
  }
  return null;
}

/**
 * The boundary of a `multipart/form-data` Content-Type (spec §2.1 rule 1):
 * the media type must be `multipart/form-data` (case-insensitive) with a
 * non-empty `boundary` parameter (quoted allowed, trailing spaces dropped),
 * ASCII, without CR or LF.
 *
 * @throws {MultipartError} `expected a multipart/form-data request` or
 * `malformed multipart/form-data boundary`.
 *
 * @example
 * ```ts
 * import { boundaryFromContentType } from "./mod.ts";
 *
 * if (boundaryFromContentType('Multipart/Form-Data; boundary="a b"') !== "a b") throw new Error();
 * ```
 */
export function boundaryFromContentType(contentType: string | null): string {
  if (!contentType || !contentType.toLowerCase().startsWith("multipart/form-data")) {
    throw new MultipartError("expected a multipart/form-data request");
  }
  const malformed = new MultipartError("malformed multipart/form-data boundary");
  const header = _parseParamHeader(contentType, true);
  if (header === null || header.value !== "multipart/form-data") throw malformed;
  const boundaries = header.params.filter(([name]) => name === "boundary");
  if (boundaries.length !== 1) throw malformed;
  const boundary = boundaries[0][1].trimEnd();
  if (boundary === "" || /[\u0080-\uffff]/.test(boundary) || /[\r\n]/.test(boundary)) {
    throw malformed;
  }
  return boundary;
}

/** Options of {@linkcode parseMultipart}. */
export interface ParseMultipartOptions {
  /**
   * Every position where `LF--boundary` starts in the body, ascending, found while the body
   * arrived (see {@linkcode delimiterMarkPattern}): the parser then uses them instead of
   * scanning the body again. They must be complete; the result is the same as without them.
   */
  marks?: readonly number[];
}

/**
 * The byte pattern whose positions {@linkcode ParseMultipartOptions.marks} lists:
 * `LF--boundary`.
 *
 * @example
 * ```ts
 * import { delimiterMarkPattern } from "./mod.ts";
 *
 * if (new TextDecoder().decode(delimiterMarkPattern("B")) !== "\n--B") throw new Error();
 * ```
 */
export function delimiterMarkPattern(boundary: string): Uint8Array {
  return _ascii("\n--" + boundary, "the boundary");
}

class _MarkFinder {
  readonly #marks: readonly number[];

  constructor(marks: readonly number[]) {
    this.#marks = marks;
  }

  /** The first mark at or after `from`. */
  find(_body: Uint8Array, from: number): number {
    const marks = this.#marks;
    let low = 0;
    let high = marks.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (marks[middle] < from) low = middle + 1;
      else high = middle;
    }
    return low < marks.length ? marks[low] : -1;
  }
}

function _ascii(text: string, what: string): Uint8Array {
  if (/[\u0080-\uffff]/.test(text)) throw new MultipartError(`${what} must be ASCII`);
  return _encoder.encode(text);
}

/**
 * Parse a multipart body exactly as upstream does (spec §2.1): the first
 * delimiter at byte 0 or after a preamble (following an LF); a candidate
 * delimiter counts only when followed by optional `--`, optional spaces/tabs,
 * then CRLF, LF or — for the closing one — the end of the body; a payload
 * ends before the LF (and one optional CR) preceding the next delimiter;
 * bytes after the closing delimiter are ignored. Part headers (LF or CRLF
 * lines, folded lines allowed, ASCII) need exactly one `Content-Disposition:
 * form-data` with exactly one non-empty `name` (`filename` tolerated),
 * exactly one `Content-Type`, a `Content-Transfer-Encoding` (if any) of
 * `binary`/`8bit`, and no nested `multipart/*`. At least one part.
 *
 * @throws {MultipartError} with upstream's message.
 *
 * @example
 * ```ts
 * import { parseMultipart } from "./mod.ts";
 *
 * const body = new TextEncoder().encode(
 *   'preamble\n--B\nContent-Disposition: form-data; name="x"\nContent-Type: text/plain\n\nhi\n--B--',
 * );
 * const [part] = parseMultipart(body, "B");
 * if (part.name !== "x" || new TextDecoder().decode(part.body) !== "hi") throw new Error();
 * ```
 */
export function parseMultipart(
  body: Uint8Array,
  boundary: string,
  options: ParseMultipartOptions = {},
): MultipartPart[] {
  if (boundary === "" || /[\r\n]/.test(boundary)) {
    throw new MultipartError("malformed multipart/form-data boundary");
  }
  const marker = _ascii("--" + boundary, "the boundary");
  const pattern = new Uint8Array(marker.length + 1);
  pattern[0] = 0x0a;
  pattern.set(marker, 1);
  const finder = options.marks ? new _MarkFinder(options.marks) : new DelimiterFinder(pattern);
  const n = body.length;
  const ml = marker.length;

  const startsWithMarker = (at: number): boolean => {
    if (at + ml > n) return false;
    for (let k = 0; k < ml; k++) if (body[at + k] !== marker[k]) return false;
    return true;
  };

  // Returns [delimiter start, index after its line, closing?].
  const nextBoundary = (start: number): [number, number, boolean] => {
    let candidate = start === 0 && startsWithMarker(0) ? 0 : -1;
    for (;;) {
      if (candidate < 0) {
        const found = finder.find(body, start);
        if (found < 0) throw new MultipartError("malformed multipart/form-data body");
        candidate = found + 1;
      }
      let tail = candidate + ml;
      const closing = tail + 1 < n && body[tail] === 0x2d && body[tail + 1] === 0x2d;
      if (closing) tail += 2;
      while (tail < n && (body[tail] === 0x20 || body[tail] === 0x09)) tail++;
      if (tail + 1 < n && body[tail] === 0x0d && body[tail + 1] === 0x0a) {
        return [candidate, tail + 2, closing];
      }
      if (tail < n && body[tail] === 0x0a) return [candidate, tail + 1, closing];
      if (closing && tail === n) return [candidate, tail, closing];
      // A boundary prefix inside binary data is not a delimiter.
      start = candidate + ml;
      candidate = -1;
    }
  };

  let [, partStart, closing] = nextBoundary(0);
  const parts: MultipartPart[] = [];
  while (!closing) {
    const [boundaryStart, nextStart, isClosing] = nextBoundary(partStart);
    closing = isClosing;
    let partEnd = boundaryStart - 1; // the delimiter's preceding LF
    if (partEnd > partStart && body[partEnd - 1] === 0x0d) partEnd--;
    // Only the current part's header lines are scanned; payload bytes stay opaque.
    let cursor = partStart;
    let payloadStart: number;
    for (;;) {
      const end = body.subarray(0, partEnd).indexOf(0x0a, cursor);
      if (end < 0) throw new MultipartError("malformed multipart part headers");
      if (end === cursor || (end === cursor + 1 && body[cursor] === 0x0d)) {
        payloadStart = end + 1;
        break;
      }
      cursor = end + 1;
    }
    const name = _checkPartHeaders(body.subarray(partStart, payloadStart));
    parts.push({ name: name[0], mediaType: name[1], body: body.subarray(payloadStart, partEnd) });
    partStart = nextStart;
  }
  if (parts.length === 0) throw new MultipartError("multipart body has no parts");
  return parts;
}

/** Validate one part's header block; returns [name, media type]. */
function _checkPartHeaders(block: Uint8Array): [string, string] {
  const headers: [string, string][] = [];
  for (const byte of block) {
    if (byte >= 0x80) throw new MultipartError("malformed multipart part headers");
  }
  const lines = new TextDecoder("latin1").decode(block).split("\n");
  lines.pop(); // the text after the blank line's LF (empty)
  lines.pop(); // the blank line
  for (let line of lines) {
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line.startsWith(" ") || line.startsWith("\t")) {
      if (headers.length === 0) throw new MultipartError("malformed multipart part headers");
      headers[headers.length - 1][1] += line;
      continue;
    }
    const colon = line.indexOf(":");
    if (colon <= 0 || !/^[\x21-\x39\x3b-\x7e]+$/.test(line.slice(0, colon))) {
      throw new MultipartError("malformed multipart part headers");
    }
    headers.push([line.slice(0, colon).toLowerCase(), line.slice(colon + 1).trim()]);
  }
  const dispositions = headers.filter(([key]) => key === "content-disposition");
  const types = headers.filter(([key]) => key === "content-type");
  if (dispositions.length !== 1) {
    throw new MultipartError("each multipart part must have one Content-Disposition");
  }
  if (types.length !== 1) {
    throw new MultipartError("each multipart part must have one Content-Type");
  }
  const disposition = _parseParamHeader(dispositions[0][1], false);
  if (disposition === null) {
    throw new MultipartError("multipart part has a malformed Content-Disposition");
  }
  const type = _parseParamHeader(types[0][1], true);
  if (type === null) throw new MultipartError("multipart part has a malformed Content-Type");
  if (type.value.startsWith("multipart/")) {
    throw new MultipartError("nested multipart parts are not supported");
  }
  if (disposition.value !== "form-data") {
    throw new MultipartError("multipart parts must use form-data disposition");
  }
  const names = disposition.params.filter(([key]) => key === "name");
  if (names.length !== 1 || names[0][1] === "") {
    throw new MultipartError("multipart part is missing its name");
  }
  const encoding = headers.find(([key]) => key === "content-transfer-encoding");
  if (encoding !== undefined && encoding[1] !== "") {
    const value = encoding[1].toLowerCase();
    if (value !== "binary" && value !== "8bit") {
      throw new MultipartError("encoded multipart parts are not supported");
    }
  }
  return [names[0][1], type.value];
}

/**
 * A fresh random boundary: `kcoral-` + 32 lowercase hex digits (128 random bits).
 *
 * @example
 * ```ts
 * import { newBoundary } from "./mod.ts";
 *
 * if (!/^kcoral-[0-9a-f]{32}$/.test(newBoundary())) throw new Error();
 * ```
 */
export function newBoundary(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let hex = "";
  for (const byte of bytes) hex += byte.toString(16).padStart(2, "0");
  return "kcoral-" + hex;
}

function _delimiterFinder(boundary: string): DelimiterFinder {
  const marker = _ascii("\r\n--" + boundary, "the boundary");
  return new DelimiterFinder(marker);
}

/**
 * Whether `CRLF--boundary` occurs in `payload` (such a payload would end its
 * part early, so the boundary must be re-drawn).
 *
 * @example
 * ```ts
 * import { boundaryOccursIn } from "./mod.ts";
 *
 * const data = new TextEncoder().encode("x\r\n--B");
 * if (!boundaryOccursIn(data, "B") || boundaryOccursIn(data, "C")) throw new Error();
 * ```
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
 * The bytes that open one part: `--B CRLF Content-Disposition: form-data;
 * name="N" CRLF Content-Type: T CRLF CRLF`. Write the payload and then
 * {@linkcode PART_SEPARATOR} after it; end the body with
 * {@linkcode closingDelimiter}.
 *
 * @example Stream a body part by part
 * ```ts
 * import { closingDelimiter, PART_SEPARATOR, parseMultipart, partHeader } from "./mod.ts";
 *
 * const chunks = [
 *   partHeader("B", "result", "application/json"),
 *   new TextEncoder().encode("{}"),
 *   PART_SEPARATOR,
 *   closingDelimiter("B"),
 * ];
 * const body = new Uint8Array(await new Blob(chunks).arrayBuffer());
 * if (parseMultipart(body, "B")[0].name !== "result") throw new Error();
 * ```
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

/**
 * `--B--` CRLF, the closing delimiter that ends a body.
 *
 * @example
 * ```ts
 * import { closingDelimiter } from "./mod.ts";
 *
 * if (new TextDecoder().decode(closingDelimiter("B")) !== "--B--\r\n") throw new Error();
 * ```
 */
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
 * Encode parts as upstream does (spec §3.3): `--B CRLF` headers `CRLF CRLF`
 * payload `CRLF` per part, then `--B-- CRLF`. The body is one allocation
 * filled with `TypedArray.set`. Without `boundary`, random `kcoral-<hex>`
 * boundaries are drawn until `CRLF--B` occurs in no payload; a given
 * `boundary` that occurs in a payload is a `MultipartError`.
 *
 * @example
 * ```ts
 * import { encodeMultipart, parseMultipart, boundaryFromContentType } from "./mod.ts";
 *
 * const data = new Uint8Array([1, 2, 3]);
 * const encoded = encodeMultipart([{ name: "return:0", contentType: "application/octet-stream", body: data }]);
 * const [part] = parseMultipart(encoded.body, boundaryFromContentType(encoded.contentType));
 * if (part.name !== "return:0" || part.body.length !== 3) throw new Error();
 * ```
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
 * Like {@linkcode encodeMultipart} but without joining: the body is `chunks` in order, so a
 * large body can be streamed without a second copy of its payloads. A given `boundary` is
 * checked against every payload except those in `scanned` (payloads the caller already knows
 * it does not occur in).
 *
 * @example
 * ```ts
 * import { encodeMultipartChunks } from "./mod.ts";
 *
 * const big = new Uint8Array(1 << 20); // checked once, when it was made
 * const parts = [{ name: "blob", contentType: "application/octet-stream", body: big }];
 * const encoded = encodeMultipartChunks(parts, "B", { scanned: new Set([big]) });
 * if (encoded.chunks[1] !== big || !encoded.contentType.endsWith("boundary=B")) throw new Error();
 * ```
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
