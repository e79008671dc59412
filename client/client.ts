/**
 * The HTTP client (spec protocol §5.3): `/health`, and `/execute` with upstream's three-attempt
 * CACHE_MISS negotiation (§2.8). How requests travel (`fetch` or the client's own HTTP/1.1, the
 * connect timeout, proxies) is the transport layer's (`transport/`); the transport is chosen
 * once, when the client is created.
 *
 * It stays one module over 400 lines because the {@linkcode Client} class is the public API
 * surface: one class whose methods share the transport and the negotiation state.
 *
 * @module
 */

import {
  type FinalAnswer,
  isLiveOutput,
  LIVE_OUTPUT_HEADER,
  LIVE_OUTPUT_VALUE,
  LiveOutputError,
  LiveOutputReader,
  type OutputChunk,
} from "../protocol/live_output.ts";
import { PartDigests } from "../protocol/part_digests.ts";
import type { KnownDigest } from "../protocol/values.ts";
import {
  boundaryOccursIn,
  encodeMultipartChunks,
  type MultipartChunks,
  type MultipartInput,
} from "../protocol/multipart_encode.ts";
import { blobBoundary, unscannedBlobs } from "./_blob_boundary.ts";
import { MultipartError } from "../protocol/multipart_parse.ts";
import {
  decodeJsonObject,
  decodeMissingBlobs,
  decodeProgramResult,
  decodeResponseBody,
  type ResponseBody,
  ResponseError,
} from "../protocol/response_decode.ts";
import { decodeServerError } from "../protocol/server_error_decode.ts";
import {
  decodeGpuReceiptHeader,
  GPU_RECEIPT_HEADER,
  type GpuReceipt,
} from "../protocol/gpu_receipt.ts";
import type { HealthBody } from "../protocol/health.ts";
import type { TypedJsonObject, TypedJsonValue } from "../protocol/json.ts";
import { JsonFloat } from "../protocol/json_float.ts";
import { pyListRepr } from "../protocol/python_repr.ts";
import { pySorted } from "../protocol/python_str.ts";
import {
  BlobsNotHeldError,
  KCoralError,
  ProtocolError,
  TransportError,
  ValidationError,
} from "./errors.ts";
import { Program } from "./program.ts";
import { evaluateKernel, type EvaluateOptions } from "./evaluate.ts";
import type { Verdict } from "./verdict.ts";
import type { ExecuteOptions, TransferProgress } from "./program_options.ts";
import { KEPT_RESULT_FACTORIES, ProgramResult, RESULT_FACTORIES } from "./result.ts";
import { KEEP_RETURNS_HEADER } from "../protocol/kept_returns.ts";
import { RemoteFunction, type RemoteFunctionOptions } from "./remote_function.ts";
import { hashesOnThread, SharedHashThread } from "./_shared_hash_thread.ts";
import {
  basicAuthorization,
  type BodyObserver,
  openTransport,
  type Transport,
  type TransportResponse,
} from "./transport/mod.ts";

/**
 * Options of {@linkcode Client}.
 *
 * @example
 * ```ts
 * import { Client, type ClientOptions } from "./mod.ts";
 *
 * const options: ClientOptions = { headers: { Authorization: "Bearer token" }, connectTimeoutSeconds: 5 };
 * await using client = new Client("http://127.0.0.1:8000", options);
 * ```
 */
export interface ClientOptions {
  /** Headers sent with every request (e.g. authorization for a proxy). */
  headers?: HeadersInit;
  /**
   * A client token (a server or Router started with `--client-token`): sent as
   * `Authorization: Bearer <token>` on every request, over any `Authorization` in `headers`.
   */
  token?: string;
  /**
   * Certificates (PEM text) of the authorities that sign an `https://` server's certificate,
   * trusted besides the system's (a self-signed deployment's CA; `--ca-file` in the CLIs).
   */
  caCerts?: readonly string[];
  /**
   * Limit for opening a TCP connection to the server, in seconds (default
   * 10); `null` disables it. It never limits how long a program runs.
   */
  connectTimeoutSeconds?: number | null;
  /**
   * How requests travel. `"auto"` (default): plain `http://` servers reached without a proxy
   * use the client's own HTTP/1.1 transport (bodies written straight from your buffers,
   * response payloads read into place and hashed as they arrive: several times faster than
   * `fetch` for large tensors); `https://` and proxied servers use `fetch`. `"fetch"`: always
   * `fetch`.
   */
  transport?: "auto" | "fetch";
}

/**
 * `GET /health` of a server or router: the fields of the protocol's
 * {@linkcode HealthBody} as sent (only `status`, always `"ok"` here, is
 * checked), and any others a server or router adds.
 *
 * @example
 * ```ts
 * import { Client, type HealthResponse } from "./mod.ts";
 *
 * const url = Deno.env.get("KCORAL_URL");
 * if (url) {
 *   await using client = new Client(url);
 *   const health: HealthResponse = await client.health();
 *   console.log(health.load);
 * }
 * ```
 */
export interface HealthResponse extends Partial<Omit<HealthBody, "status">> {
  /** `"ok"`. */
  status: "ok";
  /** Every other field as sent. */
  [field: string]: unknown;
}

/**
 * A GPU server's compilation target, e.g. `{arch: "sm_90a"}`.
 *
 * @example
 * ```ts
 * import { Client, type Target } from "./mod.ts";
 *
 * const url = Deno.env.get("KCORAL_URL");
 * if (url) {
 *   await using client = new Client(url);
 *   const target: Target = await client.target();
 *   console.log(target.arch);
 * }
 * ```
 */
export interface Target {
  /** The architecture an uploaded library must be built for. */
  arch: string;
  /** Any other fields the server reports. */
  [field: string]: unknown;
}

/** Plain JS objects from a parsed JSON value (for `health()`). */
function _plain(value: TypedJsonValue): unknown {
  if (value instanceof JsonFloat) return value.value;
  if (Array.isArray(value)) return value.map(_plain);
  if (value instanceof Map) {
    return Object.fromEntries([...value].map(([key, item]) => [key, _plain(item)]));
  }
  return value;
}

/**
 * A client for one KCoral server or router. Creating it contacts nothing.
 * Use `await using` (or call `close()`) to release pooled connections.
 *
 * Errors: a non-200 response is a {@linkcode KCoralError} (never retried), no
 * response a {@linkcode TransportError}, a response breaking the protocol a
 * {@linkcode ProtocolError}. A FAILED program is not an error: check
 * `result.completed`.
 *
 * @example
 * ```ts
 * import { Client, Program } from "./mod.ts";
 *
 * const program = new Program();
 * program.upload({ kind: "module", source: "print(1 + 1)" });
 *
 * await using client = new Client(Deno.env.get("KCORAL_URL") ?? "http://127.0.0.1:8000");
 * if (Deno.env.get("KCORAL_URL")) {
 *   const result = await client.execute(program, { timeoutSeconds: 30, outputLimitBytes: 1024 });
 *   if (!result.completed) throw new Error(result.error?.message);
 *   console.log(result.stdout); // 2
 * }
 * ```
 */
export class Client implements AsyncDisposable {
  /** The server URL without trailing slashes. */
  readonly baseUrl: string;
  readonly #headers: Headers;
  readonly #transport: Transport;
  #closed = false;
  /** Hashes large response payloads while they arrive. */
  readonly #hashes = new SharedHashThread();

  /** Create a client for `baseUrl` (e.g. `http://127.0.0.1:8000`, path prefixes allowed). */
  constructor(baseUrl: string | URL, options: ClientOptions = {}) {
    const url = new URL(String(baseUrl));
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new ValidationError(`unsupported URL scheme: ${url.protocol}`);
    }
    this.baseUrl = String(baseUrl).replace(/\/+$/, "");
    this.#headers = new Headers(options.headers);
    if (options.token !== undefined) {
      if (typeof options.token !== "string" || !/^[\x21-\x7e]+$/.test(options.token)) {
        throw new ValidationError("token must be a non-empty string of visible ASCII characters");
      }
      this.#headers.set("authorization", `Bearer ${options.token}`);
    }
    if (
      options.caCerts !== undefined &&
      !(Array.isArray(options.caCerts) && options.caCerts.every((pem) => typeof pem === "string"))
    ) {
      throw new ValidationError("caCerts must be an array of PEM strings");
    }
    // Credentials in the URL are Basic authentication, on every transport.
    if (!this.#headers.has("authorization")) {
      const authorization = basicAuthorization(url);
      if (authorization !== undefined) this.#headers.set("authorization", authorization);
    }
    const timeout = options.connectTimeoutSeconds === undefined
      ? 10
      : options.connectTimeoutSeconds;
    if (timeout !== null && !(typeof timeout === "number" && timeout > 0)) {
      throw new ValidationError("connectTimeoutSeconds must be a positive number or null");
    }
    if (options.transport !== undefined && !["auto", "fetch"].includes(options.transport)) {
      throw new ValidationError('transport must be "auto" or "fetch"');
    }
    this.#transport = openTransport(url, {
      kind: options.transport ?? "auto",
      caCerts: options.caCerts ?? [],
      connectTimeoutMs: timeout === null ? null : Math.min(timeout * 1000, 2 ** 31 - 1),
    });
  }

  /** Release pooled connections. Later requests raise `TransportError`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#transport.close();
    this.#hashes.close();
  }

  /** `await using` support: the same as {@linkcode Client.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }

  async #request(
    method: string,
    path: string,
    init: {
      body?: Uint8Array[];
      headers?: Record<string, string>;
      observe?: (headers: Headers) => BodyObserver | undefined;
      signal?: AbortSignal;
      onSent?: (sent: number, total: number) => void;
      watch?: (headers: Headers) => ((piece: Uint8Array) => void) | undefined;
    } = {},
  ): Promise<TransportResponse> {
    if (this.#closed) throw new TransportError("the client has been closed");
    const { signal } = init;
    signal?.throwIfAborted();
    const headers = new Headers(this.#headers);
    for (const [name, value] of Object.entries(init.headers ?? {})) headers.set(name, value);
    return await this.#transport.request({
      method,
      path,
      headers,
      body: init.body,
      observe: init.observe,
      signal,
      onSent: init.onSent,
      watch: init.watch,
    });
  }

  /**
   * `GET /health`: readiness, load, target and versions.
   *
   * @throws {KCoralError} for a non-200 response.
   * @throws {ProtocolError} unless the body is a JSON object with `status: "ok"`.
   *
   * @example
   * ```ts
   * import { Client } from "./mod.ts";
   *
   * const url = Deno.env.get("KCORAL_URL");
   * if (url) {
   *   await using client = new Client(url, { connectTimeoutSeconds: 10 });
   *   console.log((await client.health()).versions);
   * }
   * ```
   */
  async health(): Promise<HealthResponse> {
    return _plain(await this.#healthObject()) as HealthResponse;
  }

  async #healthObject(): Promise<TypedJsonObject> {
    const response = await this.#request("GET", "/health");
    if (response.status !== 200) throw _serverError(response);
    const body = _protocol(() => decodeJsonObject(response.body));
    if (body.get("status") !== "ok") throw new ProtocolError("health status is not ok");
    return body;
  }

  /**
   * The GPU architecture an uploaded library must be built for
   * (`health().target`); CPU servers have none.
   *
   * @throws {ProtocolError} `the server reported no compilation target`.
   *
   * @example
   * ```ts
   * import { Client } from "./mod.ts";
   *
   * const url = Deno.env.get("KCORAL_URL");
   * if (url) {
   *   await using client = new Client(url);
   *   console.log((await client.target()).arch); // e.g. sm_90a
   * }
   * ```
   */
  async target(): Promise<Target> {
    const target = (await this.#healthObject()).get("target");
    if (!(target instanceof Map) || !target.has("arch")) {
      throw new ProtocolError("the server reported no compilation target");
    }
    return _plain(target) as Target;
  }

  /**
   * Evaluate a candidate kernel against a reference (KernelBench's format) with split trust:
   * new secret inputs, the candidate in one fresh worker, the expected outputs and the
   * comparison in another that never ran it; both models timed (docs/eval.md). Resolves with
   * the {@linkcode Verdict}; see {@linkcode evaluateKernel}.
   *
   * @example
   * ```ts ignore
   * import { Client } from "./mod.ts";
   *
   * await using client = new Client("http://127.0.0.1:8000");
   * const verdict = await client.evaluate({
   *   reference: await Deno.readTextFile("reference.py"),
   *   candidate: await Deno.readTextFile("candidate.py"),
   * });
   * if (!verdict.correct || verdict.flags.length > 0) console.log(verdict.checks);
   * console.log(`speedup ${verdict.speedup?.toFixed(2)}x`);
   * ```
   */
  evaluate(options: EvaluateOptions): Promise<Verdict> {
    return evaluateKernel(this, options);
  }

  /**
   * Run a program and decode what it returns.
   *
   * Attempt 1 sends no blobs. On CACHE_MISS, attempt 2 sends exactly the
   * missing blobs (all of which the program must hold); on a second
   * CACHE_MISS, attempt 3 sends every blob; a third CACHE_MISS is a
   * {@linkcode ProtocolError}. Retries echo the previous response's
   * `X-KCoral-Node` (1–512 characters) so a router keeps the same node. The
   * result's `requestId` is the last attempt's.
   *
   * @throws {TypeError} if `program` is not a {@linkcode Program}.
   * @throws {ValidationError} if `gpuCount` is not an integer in 1..8.
   * @throws {KCoralError} on any non-200 response (no retry).
   * @throws {TransportError} when no response was obtained.
   * @throws {ProtocolError} for malformed responses or failed negotiation.
   *
   * @example
   * ```ts
   * import { Client, Program } from "./mod.ts";
   *
   * const program = new Program();
   * const module = program.upload({ kind: "module", source: "def scale(x, f):\n    return x * f\n" });
   * const scale = program.getFunction({ module, name: "scale" });
   * program.return_({ key: "output", value: program.run({ fn: scale, args: [3, 2] }) });
   *
   * const url = Deno.env.get("KCORAL_URL");
   * if (url) {
   *   await using client = new Client(url);
   *   const result = await client.execute(program, { timeoutSeconds: 120 });
   *   console.log(result.completed ? result.get("output") : result.error); // 6
   * }
   * ```
   */
  async execute(program: Program, options: ExecuteOptions = {}): Promise<ProgramResult> {
    if (!(program instanceof Program)) throw new TypeError("execute expects a Program");
    const { gpuCount } = options;
    if (
      gpuCount !== undefined &&
      (typeof gpuCount !== "number" || !Number.isInteger(gpuCount) || gpuCount < 1 ||
        gpuCount > 8)
    ) {
      throw new ValidationError("gpu_count must be an integer between 1 and 8");
    }
    const programBytes = new TextEncoder().encode(program.toJson(options));
    const { signal } = options;

    const { onProgress, onOutput } = options;
    const keep = _keepHeader(options.keepReturns);
    const post = (include: ReadonlySet<string>, route: string | null) =>
      this.#post(program, programBytes, include, route, signal, onProgress, onOutput, keep);
    let attempt = await post(new Set(), _node(options.node));
    if (attempt.body.get("status") === "CACHE_MISS") {
      if (attempt.parts.size > 0) {
        throw new ProtocolError("CACHE_MISS response must not contain binary parts");
      }
      const missing = new Set(_protocol(() => decodeMissingBlobs(attempt.body)));
      const unavailable = [...missing].filter((hash) => !program.blobs.has(hash));
      if (unavailable.length > 0) {
        throw new BlobsNotHeldError(
          unavailable,
          `server misses blobs with no local bytes to send: ${pyListRepr(pySorted(unavailable))}`,
        );
      }
      attempt = await post(missing, attempt.route);
      if (attempt.body.get("status") === "CACHE_MISS") {
        const everything = new Set(program.blobs.keys());
        attempt = await post(everything, attempt.route);
      }
      if (attempt.body.get("status") === "CACHE_MISS") {
        throw new ProtocolError("server still reports CACHE_MISS after a complete blob resend");
      }
    }
    const body = attempt.body;
    const parts = attempt.parts;
    const factories = keep === null ? RESULT_FACTORIES : KEPT_RESULT_FACTORIES;
    return new ProgramResult(
      _protocol(() => decodeProgramResult(body, parts, factories, attempt.knownDigest)),
      _gpuReceipt(attempt.gpuReceipt),
      attempt.route,
    );
  }

  async #post(
    program: Program,
    programBytes: Uint8Array,
    include: ReadonlySet<string>,
    route: string | null,
    signal: AbortSignal | undefined,
    onProgress?: (progress: TransferProgress) => void,
    onOutput?: (chunk: OutputChunk) => void,
    keep: string | null = null,
  ): Promise<
    ResponseBody & { route: string | null; knownDigest: KnownDigest; gpuReceipt: string | null }
  > {
    const parts: MultipartInput[] = [
      { name: "program", contentType: "application/json", body: programBytes },
    ];
    for (const [hash, bytes] of program.blobs) {
      if (include.has(hash)) {
        parts.push({ name: `blob:${hash}`, contentType: "application/octet-stream", body: bytes });
      }
    }
    const encoded = _encodeBody(parts, program);
    const headers: Record<string, string> = { "content-type": encoded.contentType };
    if (route !== null) headers["x-kcoral-node"] = route;
    if (onOutput) headers[LIVE_OUTPUT_HEADER] = LIVE_OUTPUT_VALUE;
    if (keep !== null) headers[KEEP_RETURNS_HEADER] = keep;
    let live: LiveOutputReader | null = null;
    let digests: PartDigests | undefined;
    let threaded = false;
    let response: TransportResponse;
    try {
      response = await this.#request("POST", "/execute", {
        body: [...encoded.chunks],
        headers,
        signal,
        observe: (responseHeaders) => {
          // A chunked answer (through a Router) has no length: no progress.
          const length = Number(responseHeaders.get("content-length") ?? 0);
          const multipart = PartDigests.forMultipart(responseHeaders);
          // Large payloads are hashed on a thread while the rest arrives.
          const thread = multipart && hashesOnThread(responseHeaders)
            ? this.#hashes.take()
            : undefined;
          threaded = thread !== undefined;
          digests = thread ? PartDigests.forMultipart(responseHeaders, thread) : multipart;
          return onProgress && length > 0 ? _reporting(digests, length, onProgress) : digests;
        },
        onSent: onProgress &&
          ((bytes, total) => onProgress({ direction: "upload", bytes, total })),
        watch: onOutput && ((responseHeaders) => {
          if (!isLiveOutput(responseHeaders.get("content-type"))) return undefined;
          const reader = live = new LiveOutputReader(onOutput);
          return (piece) => reader.push(piece);
        }),
      });
      await digests?.settle();
    } finally {
      if (threaded) this.#hashes.release();
    }
    if (response.status === 200 && onOutput && isLiveOutput(response.headers.get("content-type"))) {
      response = _liveFinal(response, live, onOutput);
    }
    if (response.status !== 200) throw _serverError(response);
    let nextRoute = response.headers.get("x-kcoral-node");
    if (nextRoute !== null && !(nextRoute.length > 0 && nextRoute.length <= 512)) nextRoute = null;
    const decoded = _protocol(() =>
      decodeResponseBody(response.headers.get("content-type"), response.body, {
        marks: digests?.marksFor(response.body),
      })
    );
    return {
      ...decoded,
      route: nextRoute,
      knownDigest: (part) => digests?.lookup(part),
      gpuReceipt: response.headers.get(GPU_RECEIPT_HEADER),
    };
  }

  /**
   * A remote function from Python source (the analogue of upstream's
   * `Client.function`); see {@linkcode RemoteFunction}.
   *
   * @example
   * ```ts
   * import { Client } from "./mod.ts";
   *
   * await using client = new Client(Deno.env.get("KCORAL_URL") ?? "http://127.0.0.1:8000");
   * const add = client.pythonFunction({ source: "def add(a, b=1):\n    return a + b\n", name: "add" });
   * if (add.buildProgram([2], { b: 3 }).instructions.length !== 4) throw new Error();
   * if (Deno.env.get("KCORAL_URL")) console.log(await add.remote([2], { b: 3 })); // 5
   * ```
   */
  pythonFunction(options: RemoteFunctionOptions): RemoteFunction {
    return new RemoteFunction(this, options);
  }
}

/**
 * The request body's pieces: with the program's boundary when it is absent from the program
 * JSON (its blobs were checked as they were added; an adopted one is checked now, if sent), else
 * a boundary drawn and checked now.
 */
function _encodeBody(parts: MultipartInput[], program: Program): MultipartChunks {
  const boundary = blobBoundary(program);
  if (boundary === undefined || boundaryOccursIn(parts[0].body, boundary)) {
    return encodeMultipartChunks(parts);
  }
  const unscanned = unscannedBlobs(program);
  const scanned = new Set([...program.blobs.values()].filter((bytes) => !unscanned.has(bytes)));
  try {
    return encodeMultipartChunks(parts, boundary, { scanned });
  } catch (error) {
    if (!(error instanceof MultipartError)) throw error;
    return encodeMultipartChunks(parts); // an adopted blob holds the boundary: draw another
  }
}

/** `X-KCoral-Keep-Returns`'s value for `keepReturns` (a byte count), `null` without one. */
function _keepHeader(keepReturns: number | undefined): string | null {
  if (keepReturns === undefined) return null;
  if (!Number.isSafeInteger(keepReturns) || keepReturns < 0) {
    throw new ValidationError("keepReturns must be a non-negative integer (bytes)");
  }
  return String(keepReturns);
}

/** A node preference as sent (1–512 characters), else `null`. */
function _node(node: string | undefined): string | null {
  if (node === undefined) return null;
  if (typeof node !== "string" || node.length === 0 || node.length > 512) {
    throw new ValidationError("node must be a Router node id of 1 to 512 characters");
  }
  return node;
}

function _protocol<T>(fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    if (error instanceof ResponseError) throw new ProtocolError(error.message, { cause: error });
    throw error;
  }
}

/**
 * The answer inside a live-output response (protocol/live_output.ts). A transport that showed
 * no pieces (`reader` null) has its whole body read here, chunks included.
 */
function _liveFinal(
  response: TransportResponse,
  reader: LiveOutputReader | null,
  onOutput: (chunk: OutputChunk) => void,
): TransportResponse {
  return _protocol(() => {
    let final: FinalAnswer;
    try {
      if (!reader) {
        reader = new LiveOutputReader(onOutput);
        reader.push(response.body);
      }
      final = reader.finish();
    } catch (error) {
      if (error instanceof LiveOutputError) throw new ProtocolError(error.message);
      throw error;
    }
    // The outer answer's routing header (a Router's) stays with the inner one.
    const headers = new Headers(final.headers);
    const node = response.headers.get("x-kcoral-node");
    if (node !== null && !headers.has("x-kcoral-node")) headers.set("x-kcoral-node", node);
    return { status: final.status, headers, body: final.body };
  });
}

/**
 * The receipt in an answer's `X-KCoral-GPU-Receipt` value; `null` without one, and for one that
 * is malformed: the receipt is a report on the result, whose own checks already passed, so a bad
 * one is dropped rather than failing the result.
 */
function _gpuReceipt(value: string | null): GpuReceipt | null {
  try {
    return decodeGpuReceiptHeader(value);
  } catch {
    return null;
  }
}

function _serverError(response: TransportResponse): KCoralError {
  const info = decodeServerError(response.status, response.body);
  return new KCoralError(response.status, info.message, {
    kind: info.kind,
    requestId: info.requestId,
    gpuReceipt: _gpuReceipt(response.headers.get(GPU_RECEIPT_HEADER)),
  });
}

/** `observer` (if any), also reporting the download's progress to `onProgress`. */
function _reporting(
  observer: BodyObserver | undefined,
  total: number,
  onProgress: (progress: TransferProgress) => void,
): BodyObserver {
  return {
    pad: (prefix) => observer?.pad(prefix) ?? 0,
    update(body, received) {
      onProgress({ direction: "download", bytes: received, total });
      return observer?.update(body, received);
    },
  };
}
