/**
 * Builds the HTTP response of a finished program (spec protocol §3.1, §3.3): the result JSON,
 * and, when binary results exist, a multipart body streamed from the part files the worker
 * wrote. The parts are moved out of the worker's results directory first, so the worker can
 * take its next request while the response streams.
 *
 * @module
 */
import {
  closingDelimiter,
  newBoundary,
  PART_SEPARATOR,
  partHeader,
} from "../protocol/multipart.ts";
import { boundaryOccursIn } from "../protocol/multipart.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { ERROR_FIELDS, GPU_ACCESS_FIELDS, resultJson } from "../protocol/response.ts";
import type { OutcomeFile, OutcomePart, WorkerOutcome } from "./execution.ts";

/** Timings and identity that go into the result JSON. */
export interface ResponseMeta {
  requestId: string;
  queueMs: number;
  elapsedMs: number;
  leaseWaitMs: number;
  leaseHeldMs: number;
  gpuIds?: number[];
  /** `interfered_request_id` for a `gpu_access` error. */
  interferedRequestId?: string | null;
}

/** A response ready to send, or the signal that it exceeds the size limit. */
export type BuiltResponse =
  | {
    kind: "ok";
    status: "COMPLETED" | "FAILED";
    body: BodyInit;
    contentType: string;
    bytes: number;
  }
  | { kind: "too_large"; bytes: number };

const _encoder = new TextEncoder();
const _IN_MEMORY_LIMIT = 1 << 20;

/**
 * Assembles the response for `outcome`. Every file of it (captured output, parts) is first
 * moved into `stagingDir` (created here), out of the worker's reach: there the worker can no
 * longer swap a file for a FIFO between the check and the open (an open that would block for
 * good). The directory is deleted once the body has been sent or cancelled.
 */
export async function buildResponse(
  outcome: WorkerOutcome,
  meta: ResponseMeta,
  outputLimitBytes: number,
  maxResponseBytes: number,
  stagingDir: string,
): Promise<BuiltResponse> {
  // Created on the first file to take: most answers have none (a trivial one pays nothing).
  const staging = new _Staging(stagingDir);
  let built: BuiltResponse | undefined;
  try {
    built = await _build(outcome, meta, outputLimitBytes, maxResponseBytes, staging);
    return built;
  } finally {
    // A streamed body removes the staging itself, once it has been sent or cancelled.
    if (!(built?.kind === "ok" && built.body instanceof ReadableStream)) await staging.remove();
  }
}

/** Large results JSON the worker wrote to a file (UTF-8, exactly its reported size). */
async function _readResultsFile(file: OutcomeFile): Promise<string> {
  const bytes = await readWorkerFile(file.path, file.size);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new WorkerFileError(`worker results ${file.path} are not UTF-8`);
  }
}

/** The directory a response's files are moved to, made when the first one comes. */
class _Staging {
  readonly #dir: string;
  #made: Promise<void> | null = null;
  readonly #moving = new Set<Promise<void>>();

  constructor(dir: string) {
    this.#dir = dir;
  }

  /** Moves a worker's file here (a missing one is the worker's fault). */
  claim<F extends { path: string }>(file: F, name: string): Promise<F> {
    const claimed = this.#claim(file, name);
    // Removal waits for every move begun (one still in flight would land after it).
    const settled = claimed.then(() => {}, () => {});
    this.#moving.add(settled);
    settled.finally(() => this.#moving.delete(settled));
    return claimed;
  }

  async #claim<F extends { path: string }>(file: F, name: string): Promise<F> {
    this.#made ??= Deno.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    await this.#made;
    const target = `${this.#dir}/${name}`;
    try {
      await Deno.rename(file.path, target); // a planted symlink moves as a symlink, refused later
    } catch (error) {
      throw new WorkerFileError(`worker result ${file.path} cannot be taken: ${error}`);
    }
    return { ...file, path: target };
  }

  async remove(): Promise<void> {
    if (this.#made === null) return;
    await Promise.all([...this.#moving]);
    await this.#made.catch(() => {});
    await Deno.remove(this.#dir, { recursive: true }).catch(() => {});
  }
}

async function _build(
  outcome: WorkerOutcome,
  meta: ResponseMeta,
  outputLimitBytes: number,
  maxResponseBytes: number,
  staging: _Staging,
): Promise<BuiltResponse> {
  const claim = async (file: OutcomeFile | null, name: string) =>
    file && file.size > 0 && outputLimitBytes > 0 ? await staging.claim(file, name) : file;
  const [stdout, stderr] = await Promise.all([
    claim(outcome.stdout, "stdout").then((file) => readCaptured(file, outputLimitBytes)),
    claim(outcome.stderr, "stderr").then((file) => readCaptured(file, outputLimitBytes)),
  ]);
  const results = outcome.results_file
    ? await _readResultsFile(await staging.claim(outcome.results_file, "results.json"))
    : outcome.results ?? "{}";
  const json = resultJson({
    status: outcome.status,
    requestId: meta.requestId,
    queueMs: meta.queueMs,
    elapsedMs: meta.elapsedMs,
    leaseWaitMs: meta.leaseWaitMs,
    leaseHeldMs: meta.leaseHeldMs,
    stdout: stdout.text,
    stderr: stderr.text,
    stdoutTruncated: stdout.truncated,
    stderrTruncated: stderr.truncated,
    gpuIds: meta.gpuIds,
    resultsJson: results,
    errorJson: outcome.status === "FAILED" ? errorJson(outcome, meta) : undefined,
  });
  const jsonBytes = _encoder.encode(json);
  const parts = outcome.parts ?? [];
  if (parts.length === 0) {
    if (jsonBytes.length > maxResponseBytes) return { kind: "too_large", bytes: jsonBytes.length };
    return {
      kind: "ok",
      status: outcome.status,
      body: jsonBytes,
      contentType: "application/json",
      bytes: jsonBytes.length,
    };
  }

  // Taken out of the worker's reach before anything reads them (a new boundary reads them all).
  const claimed: OutcomePart[] = [];
  for (const [i, part] of parts.entries()) {
    claimed.push(await staging.claim(part, `part-${i}`));
  }
  let boundary = outcome.boundary ?? "";
  if (!boundary || boundaryOccursIn(jsonBytes, boundary)) {
    boundary = await _safeBoundary(jsonBytes, claimed);
  }
  const headers = [partHeader(boundary, "result", "application/json")];
  for (let i = 0; i < parts.length; i++) {
    headers.push(partHeader(boundary, `return:${i}`, "application/octet-stream"));
  }
  const closing = closingDelimiter(boundary);
  let total = closing.length + jsonBytes.length + PART_SEPARATOR.length;
  for (const header of headers) total += header.length;
  for (const part of parts) total += part.size + PART_SEPARATOR.length;
  if (total > maxResponseBytes) return { kind: "too_large", bytes: total };

  const contentType = `multipart/form-data; boundary=${boundary}`;
  if (total <= _IN_MEMORY_LIMIT) {
    const body = new Uint8Array(total);
    let offset = 0;
    const put = (bytes: Uint8Array) => {
      body.set(bytes, offset);
      offset += bytes.length;
    };
    put(headers[0]);
    put(jsonBytes);
    put(PART_SEPARATOR);
    for (const [i, part] of claimed.entries()) {
      put(headers[i + 1]);
      const data = await readWorkerFile(part.path, part.size);
      put(data);
      put(PART_SEPARATOR);
    }
    put(closing);
    return { kind: "ok", status: outcome.status, body, contentType, bytes: total };
  }

  // Large parts stream from their open files; small ones are read now (a file kept open for
  // each of thousands of small parts ran the process out of descriptors).
  const sources: (Deno.FsFile | Uint8Array)[] = [];
  try {
    for (const part of claimed) {
      sources.push(
        part.size <= _IN_MEMORY_LIMIT
          ? await readWorkerFile(part.path, part.size) // refuses anything but the regular file
          : await openWorkerFile(part.path, part.size),
      );
    }
  } catch (error) {
    for (const source of sources) if (!(source instanceof Uint8Array)) source.close();
    throw error;
  }
  const body = _streamBody(headers, jsonBytes, sources, closing, () => staging.remove());
  return { kind: "ok", status: outcome.status, body, contentType, bytes: total };
}

/** Reads the head of a capture file: at most `limit` bytes, decoded as UTF-8 with replacement. */
export async function readCaptured(
  file: OutcomeFile | null,
  limit: number,
): Promise<{ text: string; truncated: boolean }> {
  // Nothing written (the worker's size, taken after capture ended): nothing to open or read.
  if (!file || limit === 0 || file.size === 0) return { text: "", truncated: false };
  const handle = await openWorkerFile(file.path);
  try {
    const size = (await handle.stat()).size;
    const want = Math.min(size, limit);
    const buffer = new Uint8Array(want);
    const got = await _readFully(handle, buffer);
    return {
      text: new TextDecoder("utf-8").decode(buffer.subarray(0, got)),
      truncated: size > limit,
    };
  } finally {
    handle.close();
  }
}

/** A file a worker reported is not the regular file it claims to be (never follow it). */
export class WorkerFileError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "WorkerFileError";
  }
}

/**
 * Opens a regular file a worker wrote, refusing a symlink or anything else planted in its place:
 * the file opened must be the very inode `lstat` saw (and, when given, of the expected size).
 */
export async function openWorkerFile(path: string, expectedSize?: number): Promise<Deno.FsFile> {
  const before = await Deno.lstat(path).catch(() => null);
  if (!before || !before.isFile) {
    throw new WorkerFileError(`worker result ${path} is not a regular file`);
  }
  const file = await Deno.open(path, { read: true });
  try {
    const after = await file.stat();
    if (!after.isFile || after.ino !== before.ino || after.dev !== before.dev) {
      throw new WorkerFileError(`worker result ${path} was replaced while being opened`);
    }
    if (expectedSize !== undefined && after.size !== expectedSize) {
      throw new WorkerFileError(
        `worker result ${path} has ${after.size} bytes, not ${expectedSize}`,
      );
    }
    return file;
  } catch (error) {
    file.close();
    throw error;
  }
}

/** Reads a whole worker result file safely (see {@linkcode openWorkerFile}). */
export async function readWorkerFile(path: string, expectedSize: number): Promise<Uint8Array> {
  const file = await openWorkerFile(path, expectedSize);
  try {
    const data = new Uint8Array(expectedSize);
    const got = await _readFully(file, data);
    if (got !== expectedSize) throw new WorkerFileError(`worker result ${path} changed size`);
    return data;
  } finally {
    file.close();
  }
}

/** Reads into `buffer` until it is full or the file ends; returns the bytes read. */
async function _readFully(file: Deno.FsFile, buffer: Uint8Array): Promise<number> {
  let got = 0;
  while (got < buffer.length) {
    const n = await file.read(buffer.subarray(got));
    if (n === null) break;
    got += n;
  }
  return got;
}

/** The wire `error` object of a FAILED outcome, with internal fields removed. */
export function errorJson(outcome: WorkerOutcome, meta: ResponseMeta): string {
  const source = outcome.error ?? {};
  const error: Record<string, unknown> = {};
  for (const key of ERROR_FIELDS) error[key] = source[key] ?? (key === "traceback" ? "" : null);
  if (source.kind === "gpu_access") {
    for (const key of GPU_ACCESS_FIELDS) {
      error[key] = key === "interfered_request_id"
        ? (meta.interferedRequestId ?? null)
        : (source[key] ?? outcome.gpu_access?.[key as "cuda_call" | "location"] ?? "");
    }
  }
  return JSON.stringify(error);
}

async function _safeBoundary(json: Uint8Array, parts: OutcomeFile[]): Promise<string> {
  for (;;) {
    const boundary = newBoundary();
    if (boundaryOccursIn(json, boundary)) continue;
    let clash = false;
    for (const part of parts) {
      if (boundaryOccursIn(await readWorkerFile(part.path, part.size), boundary)) {
        clash = true;
        break;
      }
    }
    if (!clash) return boundary;
  }
}

/** Streamed parts are read in 4 MiB chunks: far fewer hops through the HTTP stack than 64 KiB. */
const _STREAM_CHUNK = 4 << 20;

async function* _fileChunks(file: Deno.FsFile): AsyncGenerator<Uint8Array> {
  try {
    for (;;) {
      const chunk = new Uint8Array(_STREAM_CHUNK); // handed to the HTTP layer, never reused
      const n = await file.read(chunk);
      if (n === null) return;
      yield chunk.subarray(0, n);
    }
  } finally {
    file.close();
  }
}

function _streamBody(
  headers: Uint8Array[],
  json: Uint8Array,
  sources: (Deno.FsFile | Uint8Array)[],
  closing: Uint8Array,
  cleanup: () => Promise<void>,
): ReadableStream<Uint8Array> {
  // Every file is closed and the staging directory removed once, however the body ends: sent,
  // failed, or cancelled at any point (before its first read too, when a generator's own
  // `finally` would never run).
  let released: Promise<void> | null = null;
  const release = () =>
    released ??= (async () => {
      for (const source of sources) {
        if (source instanceof Uint8Array) continue;
        try {
          source.close();
        } catch {
          // closed after it was sent
        }
      }
      await cleanup();
    })();
  async function* chunks(): AsyncGenerator<Uint8Array> {
    try {
      yield concatBytes([headers[0], json, PART_SEPARATOR]);
      for (const [index, source] of sources.entries()) {
        yield headers[index + 1];
        if (source instanceof Uint8Array) yield source;
        else yield* _fileChunks(source); // closes the file
        yield PART_SEPARATOR;
      }
      yield closing;
    } finally {
      await release();
    }
  }
  const iterator = chunks();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done } = await iterator.next();
        if (done) controller.close();
        else controller.enqueue(value);
      } catch (error) {
        controller.error(error);
      }
    },
    async cancel() {
      await iterator.return(undefined);
      await release();
    },
  }, { highWaterMark: 0 });
}
