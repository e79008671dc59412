/**
 * The KCoral wire protocol (spec `protocol.md`), without I/O: strict JSON, multipart framing,
 * program validation, path rules, dtypes, the result-value codec, ERROR bodies, `/execute`
 * request/response encoding and decoding, the `/health` body, and Python's `repr` spellings of wire
 * messages. Shared by the client, the server and the router; byte-compatible with upstream KCoral.
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
