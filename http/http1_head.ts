/**
 * A strict HTTP/1.1 request head parser (RFC 9112 §2–§6): request line, fields, body framing.
 * Anything two readers could disagree on (request smuggling) is a {@linkcode HeadError} the server
 * answers 400: spaces in names, folding, control characters, differing `Content-Length`s, a
 * `Transfer-Encoding` other than `chunked` or beside a length, no `Host`.
 *
 * @module
 */

/** A request head refused: its message names the problem; `status` is 400, 431 or 505. */
export class HeadError extends Error {
  /** `"HeadError"`. */
  override name = "HeadError";
  /** The status to answer with. */
  readonly status: number;

  /** A refusal with `status` (default 400). */
  constructor(message: string, status = 400) {
    super(message);
    this.status = status;
  }
}

/** How a request's body is framed. */
export type BodyFraming =
  | { kind: "none" }
  | { kind: "length"; length: number }
  | { kind: "chunked" };

/** A parsed request head. */
export interface RequestHead {
  /** The method (a token, as sent). */
  method: string;
  /** The request target (origin form, e.g. `/execute?x=1`; `*` for `OPTIONS *`). */
  target: string;
  /** `1.1` or `1.0`. */
  version: "1.1" | "1.0";
  /** The header fields in order, names lower-cased. */
  fields: [string, string][];
  /** How the body is framed. */
  framing: BodyFraming;
  /** The connection stays open after the answer (by version and `Connection`). */
  keepAlive: boolean;
  /** `Expect: 100-continue` was sent. */
  expectContinue: boolean;
  /** Asks for a protocol upgrade (`Connection: upgrade`). */
  upgrade: boolean;
}

const _TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Visible ASCII, obs-text, space and tab; no other control character.
const _FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const _TARGET = /^[\x21-\x7e\x80-\xff]+$/;
const _latin1 = new TextDecoder("latin1");

/**
 * Where the head in `bytes[0, end)` ends: the index just past its empty line, or -1 when the head
 * is not complete yet. Lines end with CRLF (a bare LF is accepted, RFC 9112 §2.2).
 */
export function headEnd(bytes: Uint8Array, start: number, end: number): number {
  const view = bytes.subarray(0, end);
  for (let i = view.indexOf(10, start); i !== -1; i = view.indexOf(10, i + 1)) {
    // An LF that follows an empty line (LF LF, or LF CR LF) ends the head.
    if (i >= start + 1 && bytes[i - 1] === 10) return i + 1;
    if (i >= start + 2 && bytes[i - 1] === 13 && bytes[i - 2] === 10) return i + 1;
    // A head that begins with an empty line is not a head (leading empty lines were skipped).
  }
  return -1;
}

/**
 * Parses the head in `bytes` (request line to the empty line, inclusive). Throws a
 * {@linkcode HeadError} naming what is wrong.
 */
export function parseRequestHead(bytes: Uint8Array): RequestHead {
  const text = _latin1.decode(bytes);
  const lines = text.split("\n");
  // The empty line and what follows it are not fields.
  while (lines.length > 0 && (lines.at(-1) === "" || lines.at(-1) === "\r")) lines.pop();
  const requestLine = _line(lines.shift() ?? "");
  const parts = requestLine.split(" ");
  if (parts.length !== 3) throw new HeadError(`invalid HTTP request line: ${_show(requestLine)}`);
  const [method, target, protocol] = parts;
  if (!_TOKEN.test(method)) throw new HeadError(`invalid HTTP method: ${_show(method)}`);
  if (
    !_TARGET.test(target) || (target[0] !== "/" && target !== "*" && !/^https?:\/\//i.test(target))
  ) {
    throw new HeadError(`invalid request target: ${_show(target)}`);
  }
  if (protocol !== "HTTP/1.1" && protocol !== "HTTP/1.0") {
    throw /^HTTP\/\d\.\d$/.test(protocol)
      ? new HeadError(`HTTP version not supported: ${protocol}`, 505)
      : new HeadError(`invalid HTTP version: ${_show(protocol)}`);
  }
  const fields: [string, string][] = [];
  let lengths: string[] = [];
  let encodings: string[] = [];
  let hosts = 0;
  let connection = "";
  let expect = "";
  for (const raw of lines) {
    const line = _line(raw);
    if (line[0] === " " || line[0] === "\t") {
      throw new HeadError("obsolete line folding in a header field");
    }
    const colon = line.indexOf(":");
    if (colon <= 0) throw new HeadError(`invalid header line: ${_show(line)}`);
    const name = line.slice(0, colon);
    if (!_TOKEN.test(name)) throw new HeadError(`invalid header field name: ${_show(name)}`);
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, "");
    if (!_FIELD_VALUE.test(value)) {
      throw new HeadError(`invalid characters in header field ${_show(name)}`);
    }
    const lower = name.toLowerCase();
    fields.push([lower, value]);
    if (lower === "content-length") lengths = lengths.concat(value.split(","));
    else if (lower === "transfer-encoding") encodings = encodings.concat(value.split(","));
    else if (lower === "host") hosts++;
    else if (lower === "connection") connection += `,${value.toLowerCase()}`;
    else if (lower === "expect") expect = value.toLowerCase();
  }
  const version = protocol === "HTTP/1.1" ? "1.1" : "1.0";
  if (version === "1.1" && hosts !== 1) {
    throw new HeadError(hosts === 0 ? "missing Host header" : "more than one Host header");
  }
  const framing = _framing(
    lengths.map((value) => value.trim()),
    encodings.map((value) => value.trim().toLowerCase()).filter((value) => value !== ""),
    version,
  );
  const options = connection.split(",").map((option) => option.trim());
  return {
    method,
    target,
    version,
    fields,
    framing,
    keepAlive: version === "1.1" ? !options.includes("close") : options.includes("keep-alive"),
    expectContinue: version === "1.1" && expect === "100-continue",
    upgrade: options.includes("upgrade"),
  };
}

function _framing(lengths: string[], encodings: string[], version: "1.1" | "1.0"): BodyFraming {
  if (encodings.length > 0) {
    if (version === "1.0") throw new HeadError("Transfer-Encoding in an HTTP/1.0 request");
    if (lengths.length > 0) throw new HeadError("both Transfer-Encoding and Content-Length");
    if (encodings.length !== 1 || encodings[0] !== "chunked") {
      throw new HeadError(`unsupported Transfer-Encoding: ${_show(encodings.join(", "))}`);
    }
    return { kind: "chunked" };
  }
  if (lengths.length === 0) return { kind: "none" };
  // Up to 19 digits: a length past 2^53 is still one (an application refuses it as too large).
  if (lengths.some((value) => !/^\d{1,19}$/.test(value))) {
    throw new HeadError(`invalid Content-Length: ${_show(lengths.join(", "))}`);
  }
  if (lengths.some((value) => value !== lengths[0])) {
    throw new HeadError(`conflicting Content-Length values: ${_show(lengths.join(", "))}`);
  }
  const length = Number(lengths[0]);
  return length === 0 ? { kind: "none" } : { kind: "length", length };
}

/** A line without its CR (a bare CR elsewhere is a control character, refused as such). */
function _line(raw: string): string {
  const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
  if (line.includes("\r")) throw new HeadError("a bare CR in the request head");
  return line;
}

/** A piece of the head for a message: quoted, at most 80 characters. */
function _show(text: string): string {
  return JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}…` : text);
}
