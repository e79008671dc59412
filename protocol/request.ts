/**
 * POST /execute request bodies (spec protocol §2.2, §2.9 step 3).
 *
 * @module
 */

import {
  boundaryFromContentType,
  MultipartError,
  type MultipartPart,
  parseMultipart,
  type ParseMultipartOptions,
} from "./multipart_parse.ts";
import { isBlobHash, parseProgram, ProgramError } from "./program.ts";
import type { ParsedProgram } from "./program_types.ts";
import { sha256Hex } from "./hash.ts";
import type { KnownDigest } from "./values.ts";
import { DTYPE_ITEM_SIZES } from "./dtypes.ts";
import { pyStrRepr } from "./python_repr.ts";
import { pySorted } from "./python_str.ts";

/** A parsed, verified `/execute` request. */
export interface ExecuteRequest {
  /** The `program` part's bytes, exactly as received (a view into the body). */
  programText: Uint8Array;
  /** The validated program. */
  program: ParsedProgram;
  /** Supplied blob parts by SHA-256 (verified), in part order; views into the body. */
  blobs: Map<string, Uint8Array>;
}

/** A malformed request: HTTP 400, kind `parse`; `message` is the body's message, verbatim. */
export class RequestParseError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RequestParseError";
  }
}

/**
 * Parse a `POST /execute` body in upstream's order: multipart framing → part checks (`program`: at
 * most once, `application/json`; `blob:<sha256>`: name `^[0-9a-f]{64}$`, no duplicates,
 * `application/octet-stream`, SHA-256 of the bytes equals the name) → missing `program` → strict
 * JSON → program schema. Any other part name is `unsupported multipart part: '<name>'`.
 *
 * Unreferenced blob parts, tensor lengths and CACHE_MISS are the server's next step (spec §2.8).
 * `options` may supply what was found while the body arrived (delimiter positions, digests); the
 * outcome is the same.
 *
 * @throws {RequestParseError} with upstream's message.
 */
export function parseExecuteRequest(
  body: Uint8Array,
  contentType: string | null,
  options: ParseExecuteOptions = {},
): ExecuteRequest {
  const known = options.knownDigest;
  return _interpretParts(
    _frameRequest(body, contentType, options),
    (part) => known?.(part.body) ?? sha256Hex(part.body),
  );
}

/**
 * Options of {@linkcode parseExecuteRequest}: delimiter `marks` for {@linkcode parseMultipart}, and
 * `knownDigest`, the SHA-256 of a part computed while the body arrived (parts it does not know are
 * hashed here).
 */
export interface ParseExecuteOptions extends ParseMultipartOptions {
  /** The SHA-256 (lowercase hex) of exactly these bytes, if already known. */
  knownDigest?: KnownDigest;
}

function _frameRequest(
  body: Uint8Array,
  contentType: string | null,
  options: ParseMultipartOptions = {},
): MultipartPart[] {
  try {
    return parseMultipart(body, boundaryFromContentType(contentType), options);
  } catch (error) {
    if (error instanceof MultipartError) {
      throw new RequestParseError(error.message, { cause: error });
    }
    throw error;
  }
}

function _interpretParts(
  parts: MultipartPart[],
  digestOf: (part: MultipartPart) => string,
): ExecuteRequest {
  let programText: Uint8Array | undefined;
  const blobs = new Map<string, Uint8Array>();
  for (const part of parts) {
    if (part.name === "program") {
      if (programText !== undefined) {
        throw new RequestParseError("duplicate multipart part: 'program'");
      }
      if (part.mediaType !== "application/json") {
        throw new RequestParseError("the 'program' part must use application/json");
      }
      programText = part.body;
      continue;
    }
    if (!part.name.startsWith("blob:")) {
      throw new RequestParseError(`unsupported multipart part: ${pyStrRepr(part.name)}`);
    }
    const hash = part.name.slice(5);
    if (!isBlobHash(hash)) {
      throw new RequestParseError(`malformed blob part name: ${pyStrRepr(part.name)}`);
    }
    if (blobs.has(hash)) throw new RequestParseError(`duplicate blob part: ${hash}`);
    if (part.mediaType !== "application/octet-stream") {
      throw new RequestParseError(`blob part ${hash} must use application/octet-stream`);
    }
    const actual = digestOf(part);
    if (actual !== hash) {
      throw new RequestParseError(`blob hash mismatch: declared ${hash}, computed ${actual}`);
    }
    blobs.set(hash, part.body);
  }
  if (programText === undefined) throw new RequestParseError("missing multipart part: 'program'");
  let program: ParsedProgram;
  try {
    program = parseProgram(programText);
  } catch (error) {
    if (error instanceof ProgramError) throw new RequestParseError(error.message, { cause: error });
    throw error;
  }
  return { programText, program, blobs };
}

/**
 * Upstream's 400 for supplied blob parts no upload references (spec §2.8 step 2): `unreferenced
 * blob part(s): <sorted, comma-separated hashes>`, or `undefined` when every supplied blob is
 * referenced.
 */
export function unreferencedBlobsError(
  program: ParsedProgram,
  supplied: Iterable<string>,
): string | undefined {
  const referenced = new Set(program.blobs.map((blob) => blob.sha256));
  const unreferenced = [...new Set(supplied)].filter((hash) => !referenced.has(hash));
  if (unreferenced.length === 0) return undefined;
  return `unreferenced blob part(s): ${pySorted(unreferenced).join(", ")}`;
}

/**
 * Upstream's 400 for the first tensor upload (program order) whose resolved bytes have the wrong
 * length (spec §2.8 step 5): `tensor upload '<id>' expects <n> bytes, got <m>`, or `undefined`.
 * `lengthOf` gives the byte length of a resolved blob, `undefined` when it is missing.
 */
export function tensorLengthError(
  program: ParsedProgram,
  lengthOf: (sha256: string) => number | undefined,
): string | undefined {
  for (const upload of program.tensorUploads) {
    const length = lengthOf(upload.sha256);
    if (length !== undefined && length !== upload.byteLength) {
      let expected = BigInt(DTYPE_ITEM_SIZES[upload.dtype]);
      for (const dimension of upload.shape) expected *= BigInt(dimension);
      return `tensor upload ${pyStrRepr(upload.id)} expects ${expected} bytes, got ${length}`;
    }
  }
  return undefined;
}
