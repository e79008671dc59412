/**
 * Live output, an opt-in extension of `POST /execute` (docs/live-output.md): with
 * `X-KCoral-Stream: output`, a request that reaches a worker gets a 200 of type
 * `application/vnd.kcoral.live-output`, JSON lines of `{"stream","data"}` chunks, then
 * `{"final":{"status","headers","length":N}}` and exactly N bytes of the ordinary answer. Requests
 * turned away earlier get the ordinary answer; without the header nothing changes.
 *
 * @module
 */

/** The request header that asks for live output. */
export const LIVE_OUTPUT_HEADER = "x-kcoral-stream";
/** Its value. */
export const LIVE_OUTPUT_VALUE = "output";
/** The content type of a live-output answer. */
export const LIVE_OUTPUT_CONTENT_TYPE = "application/vnd.kcoral.live-output";

/** A piece of a stream's output. */
export interface OutputChunk {
  /** Which stream. */
  stream: "stdout" | "stderr";
  /** The text (decoded as the final result decodes it, UTF-8 with replacement). */
  data: string;
}

/** The answer carried at the end of a live-output body. */
export interface FinalAnswer {
  /** Its HTTP status. */
  status: number;
  /** Its headers (as the server would have sent them). */
  headers: Headers;
  /** Its body, byte for byte. */
  body: Uint8Array;
}

const _encoder = new TextEncoder();

/** Whether `headers` ask for live output. */
export function wantsLiveOutput(headers: Headers): boolean {
  return (headers.get(LIVE_OUTPUT_HEADER) ?? "").trim().toLowerCase() === LIVE_OUTPUT_VALUE;
}

/** Whether a response is a live-output answer (by its content type). */
export function isLiveOutput(contentType: string | null): boolean {
  return (contentType ?? "").split(";")[0].trim().toLowerCase() === LIVE_OUTPUT_CONTENT_TYPE;
}

/** One chunk line. */
export function encodeChunkLine(chunk: OutputChunk): Uint8Array {
  return _encoder.encode(`${JSON.stringify({ stream: chunk.stream, data: chunk.data })}\n`);
}

/** The final line, announcing `length` bytes of the answer's body after it. */
export function encodeFinalLine(status: number, headers: Headers, length: number): Uint8Array {
  const entries: [string, string][] = [];
  for (const [name, value] of headers) {
    if (name !== "content-length") entries.push([name, value]);
  }
  return _encoder.encode(`${JSON.stringify({ final: { status, headers: entries, length } })}\n`);
}

/** A live-output body that breaks the format above. */
export class LiveOutputError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "LiveOutputError";
  }
}

/**
 * Reads a live-output body as it arrives: `push` each piece; chunks go to `onChunk` as soon as
 * their line is complete; once the whole body is in, `finish` gives the final answer.
 */
export class LiveOutputReader {
  readonly #onChunk: (chunk: OutputChunk) => void;
  #pending: Uint8Array[] = [];
  #pendingBytes = 0;
  #final: { status: number; headers: Headers; length: number } | null = null;
  #body: Uint8Array | null = null;
  #bodyBytes = 0;
  #failure: unknown = null;

  /** A reader that hands each chunk to `onChunk`. */
  constructor(onChunk: (chunk: OutputChunk) => void = () => {}) {
    this.#onChunk = onChunk;
  }

  /**
   * The next piece of the body. Never throws: a malformed body (or an `onChunk` that throws) stops
   * the reading, and `finish` throws that error.
   */
  push(bytes: Uint8Array): void {
    if (this.#failure !== null) return;
    try {
      this.#push(bytes);
    } catch (error) {
      this.#failure = error ?? new LiveOutputError("live output reading failed");
    }
  }

  #push(bytes: Uint8Array): void {
    let rest = bytes;
    while (rest.length > 0) {
      if (this.#final) {
        const body = this.#body!;
        const n = Math.min(rest.length, body.length - this.#bodyBytes);
        if (n === 0) throw new LiveOutputError("live output continues past its final answer");
        body.set(rest.subarray(0, n), this.#bodyBytes);
        this.#bodyBytes += n;
        rest = rest.subarray(n);
        continue;
      }
      const newline = rest.indexOf(10);
      if (newline < 0) {
        this.#pending.push(rest.slice());
        this.#pendingBytes += rest.length;
        return;
      }
      this.#pending.push(rest.subarray(0, newline));
      const line = new Uint8Array(this.#pendingBytes + newline);
      let at = 0;
      for (const piece of this.#pending) {
        line.set(piece, at);
        at += piece.length;
      }
      this.#pending = [];
      this.#pendingBytes = 0;
      rest = rest.subarray(newline + 1);
      this.#line(line);
    }
  }

  #line(bytes: Uint8Array): void {
    let value: unknown;
    try {
      value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch (error) {
      throw new LiveOutputError(`live output line is not JSON: ${(error as Error).message}`);
    }
    const line = value as Record<string, unknown>;
    if (typeof line !== "object" || line === null) {
      throw new LiveOutputError("live output line is not an object");
    }
    if ("final" in line) {
      const final = line.final as Record<string, unknown>;
      const { status, headers, length } = final ?? {};
      if (
        !Number.isInteger(status) || !Array.isArray(headers) || !Number.isSafeInteger(length) ||
        (length as number) < 0
      ) {
        throw new LiveOutputError("live output final line is malformed");
      }
      const out = new Headers();
      for (const entry of headers) {
        if (!Array.isArray(entry) || entry.length !== 2) {
          throw new LiveOutputError("live output final headers are malformed");
        }
        out.append(String(entry[0]), String(entry[1]));
      }
      this.#final = { status: status as number, headers: out, length: length as number };
      this.#body = new Uint8Array(length as number);
      return;
    }
    if ((line.stream !== "stdout" && line.stream !== "stderr") || typeof line.data !== "string") {
      throw new LiveOutputError("live output chunk line is malformed");
    }
    this.#onChunk({ stream: line.stream, data: line.data });
  }

  /** The final answer; a body cut short (or without one) is a {@linkcode LiveOutputError}. */
  finish(): FinalAnswer {
    if (this.#failure !== null) throw this.#failure;
    if (!this.#final) throw new LiveOutputError("live output ended before its final answer");
    if (this.#bodyBytes !== this.#final.length) {
      throw new LiveOutputError(
        `live output final answer has ${this.#bodyBytes} of its ${this.#final.length} bytes`,
      );
    }
    return { status: this.#final.status, headers: this.#final.headers, body: this.#body! };
  }
}
