/**
 * Admission, the second stage of `/execute`: the strict parse of the body (reusing the marks and
 * digests taken while it arrived), blob resolution against the caches (or a CACHE_MISS), the
 * `gpu_count` check, the option clamps and the `request_accepted` record.
 *
 * @module
 */
import type { InstructionSummary } from "../../protocol/program_types.ts";
import { parseExecuteRequest, RequestParseError } from "../../protocol/request.ts";
import type { EventLog } from "../../http/events.ts";
import { Rejection } from "../../http/rejection.ts";
import { type BlobCaches, BlobRejected, resolveBlobs } from "../cache/blobs.ts";
import { distinctGpuCount, type ServerConfig } from "../config.ts";
import { invalidRequest, type ReceivedBody } from "./intake.ts";

/** A request ready for a worker. */
export interface Admitted {
  /** `"admitted"`. */
  kind: "admitted";
  /** The request's id. */
  requestId: string;
  /** The program JSON text as received (the worker parses it again). */
  programText: Uint8Array;
  /** Each instruction's op and id (a crash is attributed by index). */
  instructions: InstructionSummary[];
  /** SHA-256 → host path of each blob's file (pinned until {@linkcode releaseBlobs}). */
  blobPaths: Record<string, string>;
  /** The execution budget after the clamp (`timeout_seconds`). */
  timeoutSeconds: number;
  /** The capture limit per stream after the clamp. */
  outputLimit: number;
  /** `options.gpu_count`, when the request asks for a GPU set. */
  gpuCount: number | undefined;
  /** The first instruction takes the GPU lease (it can be granted with the program). */
  leaseFirst: boolean;
  /** Unpins the blobs (once, when the request is done with them). */
  releaseBlobs: () => void;
  /** `X-KCoral-Keep-Returns`: binary returns of at least this many bytes go to the cache. */
  keepMinBytes?: number;
}

/** Some blobs are neither in the request nor in a cache: the client resends them. */
export interface CacheMiss {
  /** `"cache_miss"`. */
  kind: "cache_miss";
  /** The missing SHA-256s, in first-reference order. */
  missing: string[];
}

/** What admission needs of the server. */
export interface AdmissionServices {
  /** The effective configuration. */
  config: ServerConfig;
  /** The event log (`request_accepted`, program records). */
  events: EventLog;
  /** The caches blobs resolve against. */
  caches: BlobCaches;
}

/**
 * Admits `received` (a body of `contentType`). Throws a 400 {@linkcode Rejection} for a malformed
 * request, an unreferenced blob, a tensor of the wrong length, or too large a `gpu_count`.
 */
export async function admitRequest(
  services: AdmissionServices,
  received: ReceivedBody,
  contentType: string | null,
  requestId: string,
): Promise<Admitted | CacheMiss> {
  const { config, events } = services;
  const { body, digests } = received;
  const parseStart = performance.now();
  let parsed;
  try {
    // A large body's delimiter marks and digests were taken on other threads as it arrived.
    await digests?.settle();
    parsed = parseExecuteRequest(
      body,
      contentType,
      digests ? { marks: digests.marksFor(body), knownDigest: (b) => digests.lookup(b) } : {},
    );
  } catch (error) {
    if (error instanceof RequestParseError) throw invalidRequest(error.message);
    throw error;
  }
  const program = parsed.program;
  const storeStart = performance.now();
  let blobs;
  try {
    blobs = await resolveBlobs(program, parsed.blobs, {
      ...services.caches,
      spooled: (bytes) => digests?.spooled(bytes),
      track: (write) => {
        received.noteDiskWrite(write);
        services.caches.track?.(write);
      },
    });
  } catch (error) {
    if (error instanceof BlobRejected) throw invalidRequest(error.message);
    throw error;
  } finally {
    received.blobsResolved();
  }
  if (blobs.kind === "missing") return { kind: "cache_miss", missing: blobs.missing };

  const gpuCount = program.options.gpuCount;
  if (gpuCount !== undefined && gpuCount > distinctGpuCount(config)) {
    blobs.release();
    throw new Rejection(
      400,
      "parse",
      "gpu_count exceeds this GPU server's configured capacity",
      "invalid_request",
      { error_kind: "parse" },
    );
  }
  const timeoutSeconds = Math.min(
    program.options.timeoutSeconds ?? config.defaultTimeoutSeconds,
    config.maxTimeoutSeconds,
  );
  const outputLimit = Math.min(
    program.options.outputLimitBytes ?? config.outputLimitBytes,
    config.maxOutputLimitBytes,
  );
  events.emit("INFO", "request_accepted", {
    request_id: requestId,
    request_bytes: body.length,
    timeout_seconds: timeoutSeconds,
    program: events.saveProgram(requestId, parsed.programText),
    instructions: program.instructionCount,
    ops: program.ops,
    // As upstream: only the kinds present, and null (not {} or 0) when there are none.
    uploads: Object.keys(program.uploads).length > 0 ? program.uploads : null,
    blob_bytes: blobs.bytes || null,
    spooled_blobs: blobs.spooled,
    receive_ms: parseStart - received.receiveStart,
    parse_ms: storeStart - parseStart,
    store_ms: performance.now() - storeStart,
  });
  return {
    kind: "admitted",
    requestId,
    programText: parsed.programText,
    instructions: program.instructions,
    blobPaths: blobs.paths,
    timeoutSeconds,
    outputLimit,
    gpuCount,
    leaseFirst: program.leaseFirst,
    releaseBlobs: blobs.release,
  };
}
