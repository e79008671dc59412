/**
 * Strict multipart/form-data parsing (spec protocol §2.1) with upstream `parse_multipart`'s
 * behaviour and messages. Bodies reach 256 MiB: delimiters are found by {@linkcode DelimiterFinder}
 * in linear time, and parts are views, never copies.
 *
 * @module
 */

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
 * The boundary of a `multipart/form-data` Content-Type (spec §2.1 rule 1): the media type must be
 * `multipart/form-data` (case-insensitive) with a non-empty `boundary` parameter (quoted allowed,
 * trailing spaces dropped), ASCII, without CR or LF.
 *
 * @throws {MultipartError} `expected a multipart/form-data request` or
 * `malformed multipart/form-data boundary`.
 */
export function boundaryFromContentType(contentType: string | null): string {
  if (!contentType || !contentType.toLowerCase().startsWith("multipart/form-data")) {
    throw new MultipartError("expected a multipart/form-data request");
  }
  // Made only when thrown: an error captures a stack trace (a few µs on every request).
  const malformed = () => new MultipartError("malformed multipart/form-data boundary");
  const header = _parseParamHeader(contentType, true);
  if (header === null || header.value !== "multipart/form-data") throw malformed();
  const boundaries = header.params.filter(([name]) => name === "boundary");
  if (boundaries.length !== 1) throw malformed();
  const boundary = boundaries[0][1].trimEnd();
  if (boundary === "" || /[\u0080-\uffff]/.test(boundary) || /[\r\n]/.test(boundary)) {
    throw malformed();
  }
  return boundary;
}

/** Options of {@linkcode parseMultipart}. */
export interface ParseMultipartOptions {
  /**
   * Every position where `LF--boundary` starts in the body, ascending, found while the body arrived
   * (see {@linkcode delimiterMarkPattern}): the parser then uses them instead of scanning the body
   * again. They must be complete; the result is the same as without them.
   */
  marks?: readonly number[];
}

/**
 * The byte pattern whose positions {@linkcode ParseMultipartOptions.marks} lists: `LF--boundary`.
 */
export function delimiterMarkPattern(boundary: string): Uint8Array {
  return boundaryBytes("\n--" + boundary);
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

/**
 * The bytes of `text`, a boundary or a delimiter made of one, which must be ASCII.
 *
 * @throws {MultipartError} `the boundary must be ASCII`.
 */
export function boundaryBytes(text: string): Uint8Array {
  if (/[\u0080-\uffff]/.test(text)) throw new MultipartError("the boundary must be ASCII");
  return _encoder.encode(text);
}

/**
 * Parse a multipart body exactly as upstream does (spec §2.1): the first delimiter at byte 0 or
 * after a preamble (following an LF); a candidate delimiter counts only when followed by optional
 * `--`, optional spaces/tabs, then CRLF, LF or — for the closing one — the end of the body; a
 * payload ends before the LF (and one optional CR) preceding the next delimiter; bytes after the
 * closing delimiter are ignored. Part headers (LF or CRLF lines, folded lines allowed, ASCII) need
 * exactly one `Content-Disposition: form-data` with exactly one non-empty `name` (`filename`
 * tolerated), exactly one `Content-Type`, a `Content-Transfer-Encoding` (if any) of
 * `binary`/`8bit`, and no nested `multipart/*`. At least one part.
 *
 * @throws {MultipartError} with upstream's message.
 */
export function parseMultipart(
  body: Uint8Array,
  boundary: string,
  options: ParseMultipartOptions = {},
): MultipartPart[] {
  if (boundary === "" || /[\r\n]/.test(boundary)) {
    throw new MultipartError("malformed multipart/form-data boundary");
  }
  const marker = boundaryBytes("--" + boundary);
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
