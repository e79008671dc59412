/**
 * The one place where result bodies are made: a finished program's result JSON and, with binary
 * results, a multipart body streamed from the worker's part files (moved out of its results
 * directory first, so it can take its next request meanwhile); and the FAILED body of a worker
 * that died inside an instruction.
 *
 * @module
 */
import {
  boundaryOccursIn,
  closingDelimiter,
  newBoundary,
  PART_SEPARATOR,
  partHeader,
} from "../../protocol/multipart_encode.ts";
import { concatBytes } from "../../protocol/bytes.ts";
import { resultJson } from "../../protocol/response_encode.ts";
import { ERROR_FIELDS, GPU_ACCESS_FIELDS } from "../../protocol/result_fields.ts";
import type { ResultMeta } from "../../protocol/result_fields.ts";
import type {
  OutcomeFile,
  OutcomeKept,
  OutcomePart,
  WorkerOutcome,
} from "../workers/worker_protocol.ts";
import { fillKeptDigests, keepReturns, type KeepTarget } from "./kept_returns.ts";
import {
  openWorkerFile,
  readCaptured,
  readWorkerFile,
  WorkerFileError,
} from "../workers/worker_files.ts";

/** Timings and identity that go into the result JSON (and who a `gpu_access` interfered with). */
export interface ResponseMeta extends ResultMeta {
  /** `interfered_request_id` for a `gpu_access` error. */
  interferedRequestId?: string | null;
}

/** A result body ready to send, or the signal that it exceeds the size limit. */
export type ResultBody =
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
 * Assembles the result body of `outcome`. Every file is first moved into `stagingDir`, out of the
 * worker's reach (it could swap one for a FIFO between check and open); the directory is deleted
 * once the body is sent or cancelled. Kept returns go to `keep`'s cache first.
 */
export async function buildResultBody(
  outcome: WorkerOutcome,
  meta: ResponseMeta,
  outputLimitBytes: number,
  maxResponseBytes: number,
  stagingDir: string,
  keep: KeepTarget | null = null,
): Promise<ResultBody> {
  const staging = new _Staging(stagingDir);
  let built: ResultBody | undefined;
  try {
    const kept: OutcomeKept[] = [];
    for (const [i, part] of (outcome.kept ?? []).entries()) {
      kept.push(await staging.claim(part, `kept-${i}`));
    }
    // In the cache before the answer goes: a program sent right after it finds them.
    const digests = await keepReturns(kept, keep);
    const fill = (results: string) => fillKeptDigests(results, kept, digests);
    built = await _build(outcome, meta, outputLimitBytes, maxResponseBytes, staging, fill);
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
  fill: (results: string) => string,
): Promise<ResultBody> {
  const claim = async (file: OutcomeFile | null, name: string) =>
    file && file.size > 0 && outputLimitBytes > 0 ? await staging.claim(file, name) : file;
  const [stdout, stderr] = await Promise.all([
    claim(outcome.stdout, "stdout").then((file) => readCaptured(file, outputLimitBytes)),
    claim(outcome.stderr, "stderr").then((file) => readCaptured(file, outputLimitBytes)),
  ]);
  const results = fill(
    outcome.results_file
      ? await _readResultsFile(await staging.claim(outcome.results_file, "results.json"))
      : outcome.results ?? "{}",
  );
  const json = resultJson({
    ...meta, // the timings, the request id and the GPU ids
    status: outcome.status,
    stdout: stdout.text,
    stderr: stderr.text,
    stdoutTruncated: stdout.truncated,
    stderrTruncated: stderr.truncated,
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

  // Large parts stream from their open files; small ones are read now (descriptors run out).
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

/** The error of an instruction whose worker died while running it: `runtime`, no traceback. */
export function crashError(
  index: number,
  instruction: { op: string; id: string | null },
): Record<string, unknown> {
  return {
    kind: "runtime",
    message: _CRASH_MESSAGE,
    instruction_index: index,
    instruction_op: instruction.op,
    instruction_id: instruction.id,
    traceback: "",
  };
}

/** The FAILED body of a worker that died inside an instruction (see {@linkcode crashError}). */
export function crashResultBody(meta: ResponseMeta, error: Record<string, unknown>): string {
  return resultJson({
    ...meta, // the timings, the request id and the GPU ids
    status: "FAILED",
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    resultsJson: "{}",
    errorJson: JSON.stringify(error),
  });
}

/** The message of a FAILED instruction whose worker died (upstream's). */
const _CRASH_MESSAGE = "worker exited while executing the instruction";

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

/** Streamed parts are read in 4 MiB chunks (fewer hops through the HTTP stack). */
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
  // Every file is closed and the staging removed once however the body ends (a cancel before
  // the first read included, where a generator's own `finally` would never run).
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
