/**
 * The KCoral wire protocol (spec `protocol.md`), without I/O: strict JSON,
 * multipart framing, program validation, path rules, dtypes, the
 * result-value codec, ERROR bodies, `/execute` request/response
 * encoding and decoding, the `/health` body, and Python's `repr` spellings
 * of wire messages. Shared by the client, the server and the router;
 * byte-compatible with upstream KCoral.
 *
 * @example Parse a request the way the server does
 * ```ts
 * import { encodeMultipart, parseExecuteRequest, sha256Hex } from "./mod.ts";
 *
 * const blob = new Uint8Array([0, 0, 128, 63]);
 * const hash = sha256Hex(blob);
 * const program = JSON.stringify({
 *   instructions: [{ op: "upload", kind: "tensor", blob: hash, dtype: "float32", shape: [1], id: "x" }],
 * });
 * const { contentType, body } = encodeMultipart([
 *   { name: "program", contentType: "application/json", body: new TextEncoder().encode(program) },
 *   { name: `blob:${hash}`, contentType: "application/octet-stream", body: blob },
 * ]);
 * const request = parseExecuteRequest(body, contentType);
 * if (request.program.blobs[0].tensorByteLengths[0] !== 4) throw new Error();
 * ```
 *
 * @module
 */

export * from "./bytes.ts";
export * from "./bytes_search.ts";
export * from "./json_float.ts";
export * from "./json.ts";
export * from "./json_stringify.ts";
export * from "./multipart_parse.ts";
export * from "./multipart_encode.ts";
export * from "./paths.ts";
export * from "./dtypes.ts";
export * from "./hash.ts";
export * from "./program.ts";
export * from "./program_types.ts";
export * from "./request.ts";
export * from "./errors.ts";
export * from "./values.ts";
export * from "./kept_returns.ts";
export * from "./result_fields.ts";
export * from "./response_encode.ts";
export * from "./response_decode.ts";
export * from "./server_error_decode.ts";
export * from "./health.ts";
export * from "./python_repr.ts";
export * from "./python_str.ts";
export * from "./utf8.ts";
