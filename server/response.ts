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
import { resultJson } from "../protocol/response.ts";
import type { OutcomeFile, WorkerOutcome } from "./execution.ts";

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

const _ERROR_KEYS = [
  "kind",
  "message",
  "instruction_index",
  "instruction_op",
  "instruction_id",
  "traceback",
];
const _GPU_ACCESS_KEYS = ["cuda_call", "location", "interfered_request_id"];

/**
 * Assembles the response for `outcome`. Part files are moved into `stagingDir` (created here)
 * and deleted once the body has been sent or cancelled.
 */
export async function buildResponse(
  outcome: WorkerOutcome,
  meta: ResponseMeta,
  outputLimitBytes: number,
  maxResponseBytes: number,
  stagingDir: string,
): Promise<BuiltResponse> {
  const [stdout, stderr] = await Promise.all([
    readCaptured(outcome.stdout, outputLimitBytes),
    readCaptured(outcome.stderr, outputLimitBytes),
  ]);
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
    resultsJson: outcome.results,
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

  let boundary = outcome.boundary ?? "";
  if (!boundary || boundaryOccursIn(jsonBytes, boundary)) {
    boundary = await _safeBoundary(jsonBytes, parts);
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
    for (const [i, part] of parts.entries()) {
      put(headers[i + 1]);
      const data = await Deno.readFile(part.path);
      if (data.length !== part.size) throw new Error(`result part ${i} changed size`);
      put(data);
      put(PART_SEPARATOR);
    }
    put(closing);
    return { kind: "ok", status: outcome.status, body, contentType, bytes: total };
  }

  await Deno.mkdir(stagingDir, { recursive: true, mode: 0o700 });
  const staged: string[] = [];
  for (const [i, part] of parts.entries()) {
    const target = `${stagingDir}/part-${i}`;
    await Deno.rename(part.path, target);
    staged.push(target);
  }
  const cleanup = () => Deno.remove(stagingDir, { recursive: true }).catch(() => {});
  const body = _streamBody(headers, jsonBytes, staged, closing, cleanup);
  return { kind: "ok", status: outcome.status, body, contentType, bytes: total };
}

/** Reads the head of a capture file: at most `limit` bytes, decoded as UTF-8 with replacement. */
export async function readCaptured(
  file: OutcomeFile | null,
  limit: number,
): Promise<{ text: string; truncated: boolean }> {
  if (!file || limit === 0) return { text: "", truncated: false };
  const want = Math.min(file.size, limit);
  const buffer = new Uint8Array(want);
  let got = 0;
  if (want > 0) {
    const handle = await Deno.open(file.path, { read: true });
    try {
      while (got < want) {
        const n = await handle.read(buffer.subarray(got));
        if (n === null) break;
        got += n;
      }
    } finally {
      handle.close();
    }
  }
  return {
    text: new TextDecoder("utf-8").decode(buffer.subarray(0, got)),
    truncated: file.size > limit,
  };
}

/** The wire `error` object of a FAILED outcome, with internal fields removed. */
export function errorJson(outcome: WorkerOutcome, meta: ResponseMeta): string {
  const source = outcome.error ?? {};
  const error: Record<string, unknown> = {};
  for (const key of _ERROR_KEYS) error[key] = source[key] ?? (key === "traceback" ? "" : null);
  if (source.kind === "gpu_access") {
    for (const key of _GPU_ACCESS_KEYS) {
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
      if (boundaryOccursIn(await Deno.readFile(part.path), boundary)) {
        clash = true;
        break;
      }
    }
    if (!clash) return boundary;
  }
}

function _streamBody(
  headers: Uint8Array[],
  json: Uint8Array,
  files: string[],
  closing: Uint8Array,
  cleanup: () => Promise<void>,
): ReadableStream<Uint8Array> {
  async function* chunks(): AsyncGenerator<Uint8Array> {
    try {
      yield _join(headers[0], json, PART_SEPARATOR);
      for (const [i, path] of files.entries()) {
        yield headers[i + 1];
        const file = await Deno.open(path, { read: true });
        for await (const chunk of file.readable) yield chunk;
        yield PART_SEPARATOR;
      }
      yield closing;
    } finally {
      await cleanup();
    }
  }
  return ReadableStream.from(chunks());
}

function _join(...chunks: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let offset = 0;
  for (const c of chunks) {
    out.set(c, offset);
    offset += c.length;
  }
  return out;
}
