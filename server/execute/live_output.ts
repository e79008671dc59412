/**
 * Live output on the server (docs/live-output.md): the answer of a request that asked for it, and
 * the tail that reads the worker's capture files every 50 ms while the program runs, up to the
 * output limit and decoded as the final result is, so streamed chunks are a prefix of it. A
 * capture file is opened only through a private hard link checked to be a regular file (a FIFO
 * swapped in would block an open for good); a stream that cannot be taken so is not streamed.
 *
 * @module
 */
import {
  encodeChunkLine,
  encodeFinalLine,
  LIVE_OUTPUT_CONTENT_TYPE,
  LIVE_OUTPUT_HEADER,
  LIVE_OUTPUT_VALUE,
  type OutputChunk,
} from "../../protocol/live_output.ts";
import { concatBytes } from "../../protocol/bytes.ts";
import { readFully } from "../workers/worker_files.ts";

/** How often a running program's capture files are read. */
const _LIVE_OUTPUT_INTERVAL_MS = 50;

/** One live-output answer: chunks queued with `send` (or by a `tail`), then the final answer. */
export class LiveOutput {
  #queue: Uint8Array[] = [];
  #wake: (() => void) | null = null;
  #closed = false;
  #answer: Response | null = null;

  /** Queues one chunk (dropped once the client has gone). */
  send(chunk: OutputChunk): void {
    if (this.#closed || chunk.data === "") return;
    this.#queue.push(encodeChunkLine(chunk));
    this.#notify();
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  /**
   * Starts reading the capture files in `resultsDir` (per-stream `limit` bytes); `privateDir`
   * is a new directory out of the worker's reach, removed by `stop`.
   */
  tail(resultsDir: string, limit: number, privateDir: string): OutputTail {
    return new OutputTail(resultsDir, limit, privateDir, (chunk) => this.send(chunk));
  }

  /** The 200 answer: queued chunks as they come, then the final line and `final`'s body. */
  response(requestId: string, final: Promise<Response>): Response {
    final.then((r) => {
      this.#answer = r;
      this.#notify();
    }, () => {});
    return new Response(ReadableStream.from(this.#body(final)), {
      status: 200,
      headers: {
        "content-type": LIVE_OUTPUT_CONTENT_TYPE,
        [LIVE_OUTPUT_HEADER]: LIVE_OUTPUT_VALUE,
        "x-request-id": requestId,
        "cache-control": "no-store",
      },
    });
  }

  async *#body(final: Promise<Response>): AsyncGenerator<Uint8Array> {
    let sent = false;
    try {
      for (;;) {
        if (this.#queue.length > 0) {
          const lines = this.#queue;
          this.#queue = [];
          yield lines.length === 1 ? lines[0] : concatBytes(lines);
          continue;
        }
        if (this.#answer) break;
        await new Promise<void>((resolve) => (this.#wake = resolve));
      }
      const done = this.#answer;
      const bytes = await _finalBody(done);
      sent = true;
      yield encodeFinalLine(done.status, done.headers, bytes.length);
      for await (const piece of bytes.pieces) yield piece;
    } finally {
      this.#closed = true;
      this.#queue = [];
      if (!sent) final.then((r) => r.body?.cancel().catch(() => {}), () => {});
    }
  }
}

/** The final answer's body and its length (read whole when no Content-Length says it). */
async function _finalBody(
  response: Response,
): Promise<{ length: number; pieces: AsyncIterable<Uint8Array> | Iterable<Uint8Array> }> {
  const declared = response.headers.get("content-length");
  if (declared !== null && /^\d+$/.test(declared) && response.body) {
    return { length: Number(declared), pieces: response.body };
  }
  const bytes = new Uint8Array(await response.arrayBuffer());
  return { length: bytes.length, pieces: [bytes] };
}

interface _Stream {
  name: "stdout" | "stderr";
  file: Deno.FsFile | null;
  offset: number;
  decoder: TextDecoder;
  /** Not streamed (its file could not be taken safely, or could not be read). */
  off: boolean;
}

/** Reads a running program's capture files; made by {@linkcode LiveOutput.tail}. */
export class OutputTail {
  readonly #dir: string;
  readonly #limit: number;
  readonly #private: string;
  readonly #send: (chunk: OutputChunk) => void;
  readonly #streams: _Stream[];
  #stopped = false;
  #wake: (() => void) | null = null;
  #made: Promise<void> | null = null;
  readonly #loop: Promise<void>;

  /** Starts reading (see {@linkcode LiveOutput.tail}). */
  constructor(
    resultsDir: string,
    limit: number,
    privateDir: string,
    send: (chunk: OutputChunk) => void,
  ) {
    this.#dir = resultsDir;
    this.#limit = limit;
    this.#private = privateDir;
    this.#send = send;
    this.#streams = (["stdout", "stderr"] as const).map((name) => ({
      name,
      file: null,
      offset: 0,
      decoder: new TextDecoder("utf-8"),
      off: limit <= 0,
    }));
    this.#loop = this.#run();
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      await this.#poll();
      if (this.#stopped) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, _LIVE_OUTPUT_INTERVAL_MS);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = null;
    }
  }

  /** Stops after one last read (the program has ended: everything up to the limit is sent). */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#wake?.();
    await this.#loop;
    await this.#poll();
    for (const stream of this.#streams) {
      if (!stream.off && stream.file) {
        const rest = stream.decoder.decode();
        if (rest) this.#send({ stream: stream.name, data: rest });
      }
      stream.file?.close();
      stream.file = null;
      stream.off = true;
    }
    if (this.#made) await Deno.remove(this.#private, { recursive: true }).catch(() => {});
  }

  async #poll(): Promise<void> {
    for (const stream of this.#streams) {
      if (stream.off) continue;
      try {
        stream.file ??= await this.#take(stream);
        if (stream.file) await this.#read(stream, stream.file);
      } catch {
        stream.off = true; // the final result still carries this stream
      }
    }
  }

  /** The capture file, opened through a private hard link; `null` while it does not exist. */
  async #take(stream: _Stream): Promise<Deno.FsFile | null> {
    this.#made ??= Deno.mkdir(this.#private, { recursive: true, mode: 0o700 });
    await this.#made;
    const link = `${this.#private}/${stream.name}`;
    try {
      await Deno.link(`${this.#dir}/${stream.name}`, link); // a symlink links as a symlink
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return null; // capture not started yet
      throw error;
    }
    try {
      const info = await Deno.lstat(link);
      if (!info.isFile) throw new Error(`${stream.name} capture is not a regular file`);
      return await Deno.open(link, { read: true });
    } finally {
      await Deno.remove(link).catch(() => {});
    }
  }

  async #read(stream: _Stream, file: Deno.FsFile): Promise<void> {
    const end = Math.min((await file.stat()).size, this.#limit);
    if (end <= stream.offset) return;
    const buffer = new Uint8Array(end - stream.offset);
    await file.seek(stream.offset, Deno.SeekMode.Start);
    const got = await readFully(file, buffer);
    stream.offset += got;
    const text = stream.decoder.decode(buffer.subarray(0, got), { stream: true });
    if (text) this.#send({ stream: stream.name, data: text });
  }
}
