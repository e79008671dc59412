// The HTTP client (spec protocol §5.3) with upstream's three-attempt
// CACHE_MISS negotiation (§2.8).
//
// Connect timeout: Deno's fetch has no separate connect timeout, and a
// timer covering the wait for response headers would also cover the whole
// execution (the server answers only when the program is done). So before
// each request the client opens a TCP connection to the server's host and
// port (or to the HTTP(S)_PROXY fetch will use) itself, bounded by
// `connectTimeoutSeconds`, closes it, and then sends the request with no
// timeout at all. An unreachable or refusing server is a `TransportError`
// within the limit; reading the response is never timed. The cost is one
// extra TCP handshake per request.

import { concatBytes } from "../protocol/bytes.ts";
import { type BodyObserver, connectTcp, Http1Agent, Http1ConnectError } from "./_http1.ts";
import { PartDigests } from "../protocol/_part_digests.ts";
import { HashThread } from "../protocol/_hash_thread.ts";
import type { KnownDigest } from "../protocol/values.ts";
import {
  boundaryOccursIn,
  encodeMultipartChunks,
  type MultipartChunks,
  type MultipartInput,
} from "../protocol/multipart.ts";
import { blobBoundary } from "./_blob_boundary.ts";
import {
  decodeJsonObject,
  decodeMissingBlobs,
  decodeProgramResult,
  decodeResponseBody,
  decodeServerError,
  type ResponseBody,
  ResponseError,
} from "../protocol/response.ts";
import type { TypedJsonObject, TypedJsonValue } from "../protocol/json.ts";
import { JsonFloat } from "../protocol/json_float.ts";
import { _pyListRepr, _pySorted } from "../protocol/_python.ts";
import { KCoralError, ProtocolError, TransportError, ValidationError } from "./errors.ts";
import { type ExecuteOptions, Program } from "./program.ts";
import { _factories, ProgramResult } from "./result.ts";
import { RemoteFunction, type RemoteFunctionOptions } from "./remote_function.ts";

/**
 * Options of {@linkcode Client}.
 *
 * @example
 * ```ts
 * import { Client, type ClientOptions } from "../mod.ts";
 *
 * const options: ClientOptions = { headers: { Authorization: "Bearer token" }, connectTimeoutSeconds: 5 };
 * await using client = new Client("http://127.0.0.1:8000", options);
 * ```
 */
export interface ClientOptions {
  /** Headers sent with every request (e.g. authorization for a proxy). */
  headers?: HeadersInit;
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
 * `GET /health` of a server or router (`status` is always `"ok"` here).
 *
 * @example
 * ```ts
 * import { Client, type HealthResponse } from "../mod.ts";
 *
 * const url = Deno.env.get("KCORAL_URL");
 * if (url) {
 *   await using client = new Client(url);
 *   const health: HealthResponse = await client.health();
 *   console.log(health.load);
 * }
 * ```
 */
export interface HealthResponse {
  /** `"ok"`. */
  status: string;
  /** Every other field as sent (`instance_id`, `load`, `target`, `versions`, …). */
  [field: string]: unknown;
}

/**
 * A GPU server's compilation target, e.g. `{arch: "sm_90a"}`.
 *
 * @example
 * ```ts
 * import { Client, type Target } from "../mod.ts";
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

interface _Response {
  status: number;
  headers: Headers;
  body: Uint8Array;
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
 * import { Client, Program } from "../mod.ts";
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
  readonly #connectTimeoutMs: number | null;
  /** `fetch`'s client for GET: pooled connections. */
  readonly #http: Deno.HttpClient;
  /**
   * `fetch`'s client for POST: a new connection each time, because `fetch` sends a request
   * again when a reused connection ends without an answer, and a program that was all sent may
   * have run (it must fail with `TransportError`, never run twice).
   */
  readonly #httpOnce: Deno.HttpClient;
  readonly #probe: _Endpoint;
  /** Plain HTTP without a proxy goes through this faster transport; else `fetch`. */
  readonly #direct: Http1Agent | null;
  readonly #pathPrefix: string;
  /** Origin and path prefix: where `fetch` sends `/health` and `/execute`. */
  readonly #fetchBase: string;
  #closed = false;
  #hashes: HashThread | null = null;
  /** Requests reading a response hashed on {@linkcode #hashes}. */
  #hashUsers = 0;
  /** Stops an idle hashing thread (a live `Worker` keeps the process from exiting). */
  #hashIdle: ReturnType<typeof setTimeout> | undefined;

  /** Create a client for `baseUrl` (e.g. `http://127.0.0.1:8000`, path prefixes allowed). */
  constructor(baseUrl: string | URL, options: ClientOptions = {}) {
    const url = new URL(String(baseUrl));
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new ValidationError(`unsupported URL scheme: ${url.protocol}`);
    }
    this.baseUrl = String(baseUrl).replace(/\/+$/, "");
    this.#headers = new Headers(options.headers);
    // Credentials in the URL are Basic authentication (as httpx and fetch take them), on both
    // transports; a query or fragment in it is not part of the endpoints' paths.
    if ((url.username || url.password) && !this.#headers.has("authorization")) {
      const user = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`;
      const bytes = new TextEncoder().encode(user);
      this.#headers.set("authorization", `Basic ${btoa(String.fromCharCode(...bytes))}`);
    }
    const timeout = options.connectTimeoutSeconds === undefined
      ? 10
      : options.connectTimeoutSeconds;
    if (timeout !== null && !(typeof timeout === "number" && timeout > 0)) {
      throw new ValidationError("connectTimeoutSeconds must be a positive number or null");
    }
    this.#connectTimeoutMs = timeout === null ? null : Math.min(timeout * 1000, 2 ** 31 - 1);
    const proxy = _proxyFor(url);
    this.#probe = proxy ?? _endpoint(url);
    this.#http = Deno.createHttpClient({});
    this.#httpOnce = Deno.createHttpClient({ poolMaxIdlePerHost: 0 });
    this.#pathPrefix = url.pathname.replace(/\/+$/, "");
    this.#fetchBase = url.origin + this.#pathPrefix;
    if (options.transport !== undefined && !["auto", "fetch"].includes(options.transport)) {
      throw new ValidationError('transport must be "auto" or "fetch"');
    }
    this.#direct = url.protocol === "http:" && proxy === undefined && options.transport !== "fetch"
      ? new Http1Agent({ ...this.#probe, host: url.host, connectTimeoutMs: this.#connectTimeoutMs })
      : null;
  }

  /** Release pooled connections. Later requests raise `TransportError`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#http.close();
    this.#httpOnce.close();
    this.#direct?.close();
    clearTimeout(this.#hashIdle);
    this.#hashes?.close();
    this.#hashes = null;
  }

  /** `await using` support: the same as {@linkcode Client.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }

  /** The hashing thread for one more response (none once closed); pair with `#dropHashThread`. */
  #takeHashThread(): HashThread | undefined {
    if (this.#closed) return undefined; // a thread started now would never be stopped
    clearTimeout(this.#hashIdle);
    this.#hashIdle = undefined;
    this.#hashUsers++;
    if (this.#hashes?.failed) this.#hashes = null; // replaced, not reused
    return this.#hashes ??= new HashThread();
  }

  #dropHashThread(): void {
    if (--this.#hashUsers > 0 || this.#hashes === null) return;
    // Kept a moment for the next large response, then stopped: an unclosed client must not
    // keep the process alive.
    this.#hashIdle = setTimeout(() => {
      this.#hashIdle = undefined;
      this.#hashes?.close();
      this.#hashes = null;
    }, _HASH_THREAD_IDLE_MS);
  }

  async #connectProbe(abort?: AbortSignal): Promise<void> {
    // The probe bounds the time to reach the server, before every request: `fetch` has no
    // connect timeout of its own, and a pooled connection may be gone by now (POSTs never use
    // one).
    if (this.#connectTimeoutMs === null) return;
    const target = { ...this.#probe, connectTimeoutMs: this.#connectTimeoutMs };
    try {
      (await connectTcp(target, abort, false)).close();
    } catch (error) {
      if (error instanceof Http1ConnectError) {
        throw new TransportError(error.message, { cause: error.cause });
      }
      throw error; // the caller's abort reason
    }
  }

  async #request(
    method: string,
    path: string,
    init: {
      body?: Uint8Array[];
      headers?: Record<string, string>;
      observe?: (headers: Headers) => BodyObserver | undefined;
      signal?: AbortSignal;
    } = {},
  ): Promise<_Response> {
    if (this.#closed) throw new TransportError("the client has been closed");
    const { signal } = init;
    signal?.throwIfAborted();
    const headers = new Headers(this.#headers);
    for (const [name, value] of Object.entries(init.headers ?? {})) headers.set(name, value);
    if (this.#direct) {
      try {
        return await this.#direct.request(
          method,
          this.#pathPrefix + path,
          headers,
          init.body,
          init.observe,
          signal,
        );
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (error instanceof Http1ConnectError) {
          throw new TransportError(error.message, { cause: error.cause });
        }
        throw new TransportError(`${method} ${path} failed: ${(error as Error).message}`, {
          cause: error,
        });
      }
    }
    await this.#connectProbe(signal);
    let requestBody: BodyInit | undefined;
    if (init.body) {
      let length = 0;
      for (const chunk of init.body) length += chunk.length;
      // Large bodies stream their pieces (the blobs are not copied into one buffer first).
      requestBody = length > _STREAM_BODY_BYTES
        ? ReadableStream.from(init.body)
        : concatBytes(init.body);
    }
    try {
      const response = await fetch(this.#fetchBase + path, {
        method,
        headers,
        body: requestBody,
        redirect: "manual", // like upstream (httpx): a redirect is a non-200 answer
        client: method === "GET" || method === "HEAD" ? this.#http : this.#httpOnce,
        signal,
      });
      const body = new Uint8Array(await response.arrayBuffer());
      return { status: response.status, headers: response.headers, body };
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      throw new TransportError(`${method} ${path} failed: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  /**
   * `GET /health`: readiness, load, target and versions.
   *
   * @throws {KCoralError} for a non-200 response.
   * @throws {ProtocolError} unless the body is a JSON object with `status: "ok"`.
   *
   * @example
   * ```ts
   * import { Client } from "../mod.ts";
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
   * import { Client } from "../mod.ts";
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
   * import { Client, Program } from "../mod.ts";
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

    let attempt = await this.#post(program, programBytes, new Set(), null, signal);
    if (attempt.body.get("status") === "CACHE_MISS") {
      if (attempt.parts.size > 0) {
        throw new ProtocolError("CACHE_MISS response must not contain binary parts");
      }
      const missing = new Set(_protocol(() => decodeMissingBlobs(attempt.body)));
      const unavailable = [...missing].filter((hash) => !program.blobs.has(hash));
      if (unavailable.length > 0) {
        throw new ProtocolError(
          `server misses blobs with no local bytes to send: ${_pyListRepr(_pySorted(unavailable))}`,
        );
      }
      attempt = await this.#post(program, programBytes, missing, attempt.route, signal);
      if (attempt.body.get("status") === "CACHE_MISS") {
        const everything = new Set(program.blobs.keys());
        attempt = await this.#post(program, programBytes, everything, attempt.route, signal);
      }
      if (attempt.body.get("status") === "CACHE_MISS") {
        throw new ProtocolError("server still reports CACHE_MISS after a complete blob resend");
      }
    }
    const body = attempt.body;
    const parts = attempt.parts;
    return new ProgramResult(
      _protocol(() => decodeProgramResult(body, parts, _factories, attempt.knownDigest)),
    );
  }

  async #post(
    program: Program,
    programBytes: Uint8Array,
    include: ReadonlySet<string>,
    route: string | null,
    signal: AbortSignal | undefined,
  ): Promise<ResponseBody & { route: string | null; knownDigest: KnownDigest }> {
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
    let digests: PartDigests | undefined;
    let threaded = false;
    let response: _Response;
    try {
      response = await this.#request("POST", "/execute", {
        body: [...encoded.chunks],
        headers,
        signal,
        observe: (responseHeaders) => {
          const length = Number(responseHeaders.get("content-length") ?? 0);
          const multipart = PartDigests.forMultipart(responseHeaders);
          // Large payloads are hashed on a thread while the rest arrives.
          const thread = multipart && length >= _THREAD_HASH_BYTES
            ? this.#takeHashThread()
            : undefined;
          threaded = thread !== undefined;
          return digests = thread ? PartDigests.forMultipart(responseHeaders, thread) : multipart;
        },
      });
      await digests?.settle();
    } finally {
      if (threaded) this.#dropHashThread();
    }
    if (response.status !== 200) throw _serverError(response);
    let nextRoute = response.headers.get("x-kcoral-node");
    if (nextRoute !== null && !(nextRoute.length > 0 && nextRoute.length <= 512)) nextRoute = null;
    const decoded = _protocol(() =>
      decodeResponseBody(response.headers.get("content-type"), response.body, {
        marks: digests?.marksFor(response.body),
      })
    );
    return { ...decoded, route: nextRoute, knownDigest: (part) => digests?.lookup(part) };
  }

  /**
   * A remote function from Python source (the analogue of upstream's
   * `Client.function`); see {@linkcode RemoteFunction}.
   *
   * @example
   * ```ts
   * import { Client } from "../mod.ts";
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
 * JSON (its blobs were checked as they were added), else a boundary drawn and checked now.
 */
function _encodeBody(parts: MultipartInput[], program: Program): MultipartChunks {
  const boundary = blobBoundary(program);
  if (boundary === undefined || boundaryOccursIn(parts[0].body, boundary)) {
    return encodeMultipartChunks(parts);
  }
  const scanned = new Set(program.blobs.values());
  return encodeMultipartChunks(parts, boundary, { scanned });
}

interface _Endpoint {
  hostname: string;
  port: number;
}

function _endpoint(url: URL): _Endpoint {
  return {
    hostname: url.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: url.port !== "" ? Number(url.port) : url.protocol === "https:" ? 443 : 80,
  };
}

function _env(name: string): string | undefined {
  try {
    return Deno.env.get(name) || Deno.env.get(name.toLowerCase()) || undefined;
  } catch {
    return undefined; // no --allow-env: fetch cannot see a proxy either
  }
}

/**
 * The proxy fetch will connect to for `url` (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY,
 * minus NO_PROXY), so the connect probe times the connection that is really used.
 */
function _proxyFor(url: URL): _Endpoint | undefined {
  const proxy = url.protocol === "https:"
    ? _env("HTTPS_PROXY") ?? _env("ALL_PROXY")
    : _env("HTTP_PROXY") ?? _env("ALL_PROXY");
  if (proxy === undefined) return undefined;
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  for (const entry of (_env("NO_PROXY") ?? "").split(",")) {
    const pattern = entry.trim().toLowerCase().replace(/:\d+$/, "").replace(/^\*?\./, "");
    if (pattern === "*" || (pattern !== "" && (host === pattern || host.endsWith("." + pattern)))) {
      return undefined;
    }
  }
  try {
    const proxyUrl = new URL(proxy.includes("://") ? proxy : `http://${proxy}`);
    const endpoint = _endpoint(proxyUrl);
    if (proxyUrl.port === "" && proxyUrl.protocol.startsWith("socks")) endpoint.port = 1080;
    return endpoint;
  } catch {
    return undefined;
  }
}

function _protocol<T>(fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    if (error instanceof ResponseError) throw new ProtocolError(error.message, { cause: error });
    throw error;
  }
}

function _serverError(response: _Response): KCoralError {
  const info = decodeServerError(response.status, response.body);
  return new KCoralError(response.status, info.message, {
    kind: info.kind,
    requestId: info.requestId,
  });
}

const _STREAM_BODY_BYTES = 8 * 1024 * 1024;
const _THREAD_HASH_BYTES = 8 * 1024 * 1024;
const _HASH_THREAD_IDLE_MS = 1000;
