/**
 * `POST /execute` at the Router (spec router §2.2): one attempt, from the client's request to
 * the node's answer, through a slot. Nothing is ever replayed: once the request head has gone
 * to a node, a failure is a 502.
 *
 * ```
 *  id, preferred node ─▶ Content-Length (400 / 413) ─▶ registry.acquire (503 router_busy /
 *  no_node, Retry-After: 1) ─▶ request_head ─▶ upload (concurrently: 413, 400, 502)
 *    (or, a body of one frame to a node that takes whole frames: read, then head, body and
 *    end in one message; a slot gone meanwhile had nothing sent: another slot takes it)
 *  ─▶ response_head (502 when out of turn or gone) ─▶ an answer of one frame (declared by its
 *  length, not live output) taken whole to the node's end and sent with its length; any other
 *  streamed to the client
 *  ─▶ node's end: slot back to its FIFO (or discarded when the upload had not finished)
 *  client gone (before the answer: noticed through ClientWatch; after: by the answer's stream)
 *    ─▶ cancel client_disconnected
 * ```
 *
 * One `request_finished` console event per attempt, with the request id the node's own
 * `events.jsonl` has for it.
 *
 * @module
 */
import {
  isValidNodeId,
  MAX_DATA_BYTES,
  NODE_HEADER,
  type ResponseHead,
} from "../protocol/node_link.ts";
import { DATA_HEADER_BYTES } from "../http/tunnel_body.ts";
import { declaredLength } from "../http/request_body.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { isLiveOutput } from "../protocol/live_output.ts";
import type { EventLog } from "../http/events.ts";
import {
  DROPPED_REQUEST_HEADERS,
  DROPPED_RESPONSE_HEADERS,
  forwardedHeaders,
  forwardedResponseEntries,
  validHeaderEntries,
} from "./headers.ts";
import { RouterStopping } from "./admission.ts";
import type { SlotLease } from "./connections.ts";
import type { NodeRegistry } from "./registry.ts";
import { type RouterSlot, TunnelError, type TunnelExchange } from "./slot_link.ts";
import type { ClientWatch } from "./client_watch.ts";
import type { StallWatch } from "../http/stall_watch.ts";

/** What forwarding needs of the Router. */
export interface ForwardContext {
  /** Nodes and their slots. */
  registry: NodeRegistry;
  /** The largest request body. */
  maxRequestBytes: number;
  /** Where `request_finished` goes. */
  events: EventLog;
  /** Called once the attempt has finished (answered, streamed, abandoned). */
  onFinished?: () => void;
  /** Notices a client that goes away while its request is on a node (default: not noticed). */
  clientWatch?: ClientWatch;
  /** Cuts a request body that stops arriving (408; default: never cut). */
  bodyWatch?: StallWatch;
}

/** Why an attempt ended (`finish_reason` of `request_finished`). */
export type FinishReason =
  | "completed"
  | "client_disconnected"
  | "queue_full"
  | "queue_timeout"
  | "tunnel_disconnected"
  | "invalid_response"
  | "request_rejected";

/** An answer the Router makes itself (spec router §2.2, "Error body"). */
class _RouterError extends Error {
  constructor(
    readonly status: number,
    readonly kind: string,
    message: string,
    readonly reason: FinishReason,
  ) {
    super(message);
  }
}

const _TRANSPORT_MESSAGE =
  "KCoral Server tunnel failed; execution outcome is unknown and was not retried";
const _UPLOAD_TRANSPORT_MESSAGE = "tunnel failed; execution outcome is unknown and was not retried";

/** The per-attempt record behind `request_finished`. */
class _Trace {
  readonly id: string = crypto.randomUUID();
  readonly started: number = performance.now();
  node = "";
  status = 0;
  queueWaitMs = 0;
  reason: FinishReason = "client_disconnected";
  /** The kind of an answer the Router made itself (`router_busy`, `server_transport`, ...). */
  errorKind: string | null = null;
  requestBytes = 0;
  responseBytes = 0;
  #done = false;

  finish(ctx: ForwardContext): void {
    if (this.#done) return;
    this.#done = true;
    const events = ctx.events;
    events.emit(this.status >= 500 || this.status === 0 ? "WARNING" : "INFO", "request_finished", {
      request_id: this.id,
      node: this.node,
      http_status: this.status,
      queue_wait_ms: Math.round(this.queueWaitMs),
      duration_ms: Math.round(performance.now() - this.started),
      request_bytes: this.requestBytes,
      response_bytes: this.responseBytes,
      finish_reason: this.reason,
      error_kind: this.errorKind,
    });
    ctx.onFinished?.();
  }
}

function _errorResponse(error: _RouterError, trace: _Trace, ctx: ForwardContext): Response {
  trace.status = error.status;
  trace.reason = error.reason;
  trace.errorKind = error.kind;
  trace.finish(ctx);
  const headers = new Headers({ "content-type": "application/json", "x-request-id": trace.id });
  if (error.status === 503) headers.set("retry-after", "1");
  return new Response(
    JSON.stringify({
      status: "ERROR",
      request_id: trace.id,
      error: { kind: error.kind, message: error.message },
    }),
    // A client that went away (status 0) gets nothing; the answer only has to be valid.
    { status: error.status || 499, headers },
  );
}

function _contentLength(headers: Headers): number | null {
  const length = declaredLength(headers);
  if (Number.isNaN(length)) {
    throw new _RouterError(400, "invalid_request", "invalid Content-Length", "request_rejected");
  }
  return length;
}

/**
 * Forwards one `POST /execute` through a node's slot and returns the answer to stream back.
 *
 * @example
 * ```ts
 * import { forwardExecute } from "./forward.ts";
 * import { NodeRegistry } from "./registry.ts";
 * import { EventLog } from "../http/events.ts";
 *
 * const registry = new NodeRegistry({
 *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2, nodeRetentionMs: 600_000,
 *   statusCheckIntervalMs: 1000, maxQueuedRequests: 0, queueWaitTimeoutMs: 0,
 * });
 * const events = new EventLog({ logDir: null, console: false, programs: false });
 * const response = await forwardExecute(
 *   new Request("http://router/execute", { method: "POST", body: "x" }),
 *   { registry, maxRequestBytes: 1 << 20, events },
 * );
 * if (response.status !== 503 || response.headers.get("retry-after") !== "1") throw new Error();
 * await response.body?.cancel();
 * registry.close();
 * ```
 */
export async function forwardExecute(
  request: Request,
  ctx: ForwardContext,
  clientPort: number | null = null,
): Promise<Response> {
  const trace = new _Trace();
  let lease: SlotLease | null = null;
  try {
    const preferredHeader = request.headers.get(NODE_HEADER);
    const preferred = isValidNodeId(preferredHeader) ? preferredHeader : null;
    const length = _contentLength(request.headers);
    if (length !== null && length > ctx.maxRequestBytes) {
      throw new _RouterError(
        413,
        "request_too_large",
        "request body is too large",
        "request_rejected",
      );
    }
    // A body of at most one data frame is read before a slot is taken (a body that stalls never
    // holds one), and kept if the slot goes away before anything was sent on it: the request
    // then takes another slot (it never reached a node).
    let read: Uint8Array | null = null;
    if (length !== null ? length <= MAX_DATA_BYTES : !request.body) {
      const small = await _smallBodyInTime(request, length, ctx);
      if (small instanceof _RouterError) throw small;
      read = small;
    }
    for (let attempt = 1;; attempt++) {
      // A free slot is taken at once; only a request that must wait goes through the queue.
      lease = ctx.registry.tryAcquire(preferred) ??
        await _acquire(request, preferred, trace, ctx, clientPort);
      trace.node = lease.nodeId;
      const outcome = await _exchange(request, length, lease, trace, ctx, read, clientPort);
      if (!(outcome instanceof _SlotGoneUnsent)) return outcome;
      lease = null;
      read = outcome.body;
      if (attempt === _UNSENT_ATTEMPTS) {
        throw new _RouterError(502, "server_transport", _TRANSPORT_MESSAGE, "tunnel_disconnected");
      }
    }
  } catch (error) {
    if (error instanceof _RouterError) return _errorResponse(error, trace, ctx);
    (lease?.slot as RouterSlot | undefined)?.close("cancelled", "request_rejected");
    lease?.release(false);
    throw error;
  }
}

/** Slots a request may take in turn when each goes away before anything was sent on it. */
const _UNSENT_ATTEMPTS = 3;

/** The held slot went away before anything of the request was sent on it; its body so far. */
class _SlotGoneUnsent {
  constructor(readonly body: Uint8Array) {}
}

/** A slot for the request (its queue wait added to the trace); throws the 503 or client error to answer. */
async function _acquire(
  request: Request,
  preferred: string | null,
  trace: _Trace,
  ctx: ForwardContext,
  clientPort: number | null,
): Promise<SlotLease> {
  const queued = performance.now();
  // A client that leaves while its request waits gives its place up: noticed through its
  // signal or, for a request Deno.serve does not signal, its connection (ClientWatch).
  const left = new AbortController();
  const unwatch = ctx.clientWatch?.watch(request, () => left.abort(), clientPort) ?? _unwatched;
  try {
    return await ctx.registry.acquire(
      preferred,
      () => AbortSignal.any([request.signal, left.signal]),
    );
  } catch (error) {
    const kind = (error as { kind?: string }).kind;
    if (error instanceof RouterStopping) {
      throw new _RouterError(503, "router_busy", "router is shutting down", "queue_timeout");
    }
    if (kind === "router_busy") {
      throw new _RouterError(503, "router_busy", "router queue is full", "queue_full");
    }
    if (kind === "no_node") {
      throw new _RouterError(
        503,
        "no_node",
        "no compatible node has an available slot",
        "queue_timeout",
      );
    }
    throw new _RouterError(0, "invalid_request", "client went away", "client_disconnected");
  } finally {
    unwatch();
    trace.queueWaitMs += performance.now() - queued;
  }
}

async function _exchange(
  request: Request,
  length: number | null,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
  read: Uint8Array | null,
  clientPort: number | null,
): Promise<Response | _SlotGoneUnsent> {
  // The registry hands out the slots the hub registered, which are RouterSlots.
  const slot = lease.slot as RouterSlot;
  const headers = forwardedHeaders(request.headers, DROPPED_REQUEST_HEADERS);
  headers.push(["x-request-id", trace.id]);
  if (length !== null) headers.push(["content-length", String(length)]);
  // A body that fits one data frame (read before the slot was taken) goes with its head in one
  // whole frame when the node takes them.
  const whole = read;
  let exchange: TunnelExchange;
  let sentWhole = false;
  try {
    const wholeExchange = whole && slot.takesWhole
      ? slot.beginWhole(trace.id, headers, length, whole)
      : null;
    sentWhole = wholeExchange !== null;
    exchange = wholeExchange ?? slot.begin(trace.id, headers, length);
  } catch (error) {
    if (!(error instanceof TunnelError)) throw error;
    lease.release(false);
    // Gone while its body was read: nothing was sent, so another slot may take the request.
    if (whole) return new _SlotGoneUnsent(whole);
    throw new _RouterError(502, "server_transport", _TRANSPORT_MESSAGE, "tunnel_disconnected");
  }
  // Settles only with what ends the attempt before its answer: the upload's error, or the client
  // going away while the node works (an upload that ended leaves the answer to come).
  const { promise: interrupted, resolve: interrupt, reject } = Promise.withResolvers<
    _RouterError
  >();
  if (sentWhole) trace.requestBytes = whole!.length;
  else {
    _upload(
      request,
      exchange,
      length,
      ctx.maxRequestBytes,
      trace,
      whole,
      ctx.bodyWatch,
      ctx.clientWatch,
      clientPort,
    )
      .then((error) => error && interrupt(error), reject);
  }
  const unwatch = ctx.clientWatch?.watch(request, () => interrupt(_clientGone()), clientPort) ??
    _unwatched;
  try {
    return await _answer(exchange, interrupted, lease, trace, ctx);
  } finally {
    // Once the answer is the client's (whole, or its stream begun), its stream notices a client
    // that goes away.
    unwatch();
  }
}

const _unwatched = () => {};

const _clientGone = () =>
  new _RouterError(0, "invalid_request", "client went away", "client_disconnected");

/** The node's answer for the client, once its head comes. */
async function _answer(
  exchange: TunnelExchange,
  interrupted: Promise<_RouterError>,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
): Promise<Response> {
  let head: ResponseHead;
  try {
    // The head, or an upload that failed or a client that went away first.
    const first: ResponseHead | _RouterError = await Promise.race([exchange.head, interrupted]);
    if (first instanceof _RouterError) throw first;
    head = first;
  } catch (error) {
    const failure = error instanceof _RouterError
      ? error
      : error instanceof TunnelError
      ? new _RouterError(502, "server_transport", _TRANSPORT_MESSAGE, error.reason)
      : null;
    if (!failure) throw error;
    exchange.cancel(_cancelReason(failure.reason)); // a no-op once the slot is gone
    lease.release(false);
    throw failure;
  }
  // The entries themselves go to the client's Response: a repeated header stays repeated.
  const responseHeaders = forwardedResponseEntries(head.headers, DROPPED_RESPONSE_HEADERS);
  if (!validHeaderEntries(responseHeaders)) {
    // Headers no HTTP answer can carry (spec router §2.2 item 7: not decodable).
    exchange.cancel("invalid_response");
    lease.release(false);
    throw new _RouterError(502, "server_transport", _TRANSPORT_MESSAGE, "invalid_response");
  }
  responseHeaders.push([NODE_HEADER, lease.nodeId], ["x-request-id", trace.id]);
  trace.status = head.status;
  if (head.status === 503) lease.markSaturated();
  // A status that has no body (204, 205, 304) gets none, whatever the node sent: the node's
  // bytes are read to its end all the same (the slot is settled there) and dropped.
  const bodyless = _NULL_BODY_STATUSES.has(head.status);
  const init = { status: head.status, headers: responseHeaders };
  const complete = exchange.wholeBody;
  if (complete !== null) {
    // The node's whole frame brought the head, the body and the end at once: the answer is
    // here, nothing to wait for.
    trace.responseBytes = complete.length;
    _answered(exchange, lease, trace, ctx);
    return new Response(bodyless ? null : complete as Uint8Array<ArrayBuffer>, init);
  }
  if (_declaresOneFrame(head)) {
    const whole = await _wholeAnswer(exchange, interrupted, lease, trace, ctx);
    if (whole) return new Response(bodyless ? null : whole, init);
  }
  const body = _responseBody(exchange, interrupted, lease, trace, ctx);
  if (!bodyless) return new Response(body, init);
  body.pipeTo(new WritableStream()).catch(() => {});
  return new Response(null, init);
}

/** Statuses whose responses have no body (a node's status is 200–599: no 1xx comes). */
const _NULL_BODY_STATUSES = new Set([204, 205, 304]);

/**
 * Whether the node declared an answer of at most one data frame (its `Content-Length`; a node's
 * server declares one only for an answer it holds whole), other than live output.
 */
function _declaresOneFrame(head: ResponseHead): boolean {
  let declared = false;
  for (const [name, value] of head.headers) {
    const lower = name.toLowerCase();
    if (lower === "content-type" && isLiveOutput(value)) return false;
    if (lower === "content-length") {
      declared = /^\d{1,7}$/.test(value) && Number(value) <= MAX_DATA_BYTES;
    }
  }
  return declared;
}

/**
 * An answer of at most one data frame, taken whole up to the node's `end` (decisions.md, "The
 * Router answers a small answer whole"): the client then gets it with its length in one write,
 * where a streamed answer costs the Router a stream, chunked framing and a second write. `null`
 * once the answer is larger (nothing taken: it is streamed). Whatever `Content-Length` the node
 * declared, the bytes up to its `end` are the answer. The slot is settled as at a streamed
 * answer's end; an upload failing first, a client going away (`ForwardContext.clientWatch`)
 * or the slot failing are answered as before the head.
 */
async function _wholeAnswer(
  exchange: TunnelExchange,
  interrupted: Promise<_RouterError>,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
): Promise<Uint8Array<ArrayBuffer> | null> {
  let answer: Uint8Array | null | _RouterError;
  try {
    answer = await Promise.race([
      exchange.body.wholeIfWithin(MAX_DATA_BYTES),
      interrupted,
    ]);
  } catch (error) {
    // forwardExecute answers it (its log line included); the slot is given up here.
    const reason = error instanceof TunnelError ? error.reason : "tunnel_disconnected";
    lease.release(false);
    throw new _RouterError(502, "server_transport", _TRANSPORT_MESSAGE, reason);
  }
  if (answer instanceof _RouterError) {
    exchange.cancel(_cancelReason(answer.reason));
    lease.release(false);
    throw answer;
  }
  if (answer === null) return null;
  trace.responseBytes = answer.length;
  _answered(exchange, lease, trace, ctx);
  return answer as Uint8Array<ArrayBuffer>;
}

/**
 * The node's `end` has come: the slot goes back reusable only if the upload had ended too (its
 * `end` was sent before the node's could come back, unless the node answered early).
 */
function _answered(
  exchange: TunnelExchange,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
): void {
  if (exchange.upload.ended) _settle(exchange, lease, trace, ctx, "completed", true);
  else _settle(exchange, lease, trace, ctx, "completed", false, "request_rejected");
}

/** The attempt is over: its reason, the slot cancelled if need be and released, its log line. */
function _settle(
  exchange: TunnelExchange,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
  reason: FinishReason,
  reusable: boolean,
  cancel?: FinishReason,
): void {
  trace.reason = reason;
  if (cancel) exchange.cancel(_cancelReason(cancel));
  lease.release(reusable);
  // At once, not on a timer: the console line is only gathered here (it is written with others
  // later, http/events.ts), and a timer per request cost the Router more than the event itself
  // (decisions.md, "The Router finishes an attempt without a timer").
  trace.finish(ctx);
}

function _cancelReason(reason: FinishReason) {
  return reason === "client_disconnected"
    ? "client_disconnected"
    : reason === "invalid_response"
    ? "invalid_response"
    : "request_rejected";
}

/** Sends the client's body; resolves with the error to answer, or `null` once `end` went out. */
async function _upload(
  request: Request,
  exchange: TunnelExchange,
  length: number | null,
  limit: number,
  trace: _Trace,
  read: Uint8Array | null,
  bodyWatch?: StallWatch,
  clientWatch?: ClientWatch,
  clientPort: number | null = null,
): Promise<_RouterError | null> {
  try {
    const body = request.body;
    const total = read
      ? await _sendBytes(read, exchange, trace)
      : !body
      ? 0
      : await _sendBody(body, exchange, length, limit, trace, bodyWatch);
    if (total instanceof _RouterError) return total;
    if (length !== null && total !== length) return _lengthMismatch();
    // A large body is read only once a slot is free: a client that left while it waited is seen
    // now, and its request is cancelled before its body ends on the node (so it never starts).
    if (!read && body && clientWatch?.present(clientPort) === false) return _clientGone();
    await exchange.upload.end();
    trace.requestBytes = exchange.upload.sentBytes;
    return null;
  } catch (error) {
    if (!(error instanceof TunnelError)) throw error;
    return new _RouterError(
      502,
      "server_transport",
      _UPLOAD_TRANSPORT_MESSAGE,
      "tunnel_disconnected",
    );
  }
}

const _lengthMismatch = () =>
  new _RouterError(
    400,
    "invalid_request",
    "Content-Length does not match request body",
    "request_rejected",
  );

const _clientFailed = () =>
  new _RouterError(
    400,
    "invalid_request",
    "client request body failed while streaming",
    "client_disconnected",
  );

/**
 * The whole body of a request that declared at most one data frame (or has none), read before
 * anything is sent: its bytes, or the error to answer (the client's body failed, or its length
 * is not the declared one).
 */
async function _smallBody(
  request: Request,
  length: number | null,
): Promise<Uint8Array | _RouterError> {
  const bytes = await _readBody(request);
  if (bytes instanceof _RouterError) return bytes;
  if (length !== null && bytes.length !== length) return _lengthMismatch();
  return bytes;
}

/**
 * {@linkcode _smallBody} under the body timeout: a body not whole by then is answered 408 (what
 * still arrives is read by `Deno.serve` and dropped).
 */
async function _smallBodyInTime(
  request: Request,
  length: number | null,
  ctx: ForwardContext,
): Promise<Uint8Array | _RouterError> {
  const watch = ctx.bodyWatch;
  if (!request.body || !watch) return await _smallBody(request, length);
  const { promise: stalled, resolve } = Promise.withResolvers<_RouterError>();
  const read = watch.watch(() => resolve(_bodyTimeout(watch.timeoutMs)));
  try {
    return await Promise.race([_smallBody(request, length), stalled]);
  } finally {
    read.done();
  }
}

const _bodyTimeout = (timeoutMs: number) =>
  new _RouterError(
    408,
    "timeout",
    `request body not received in time: no bytes for ${timeoutMs / 1000} s`,
    "request_rejected",
  );

/**
 * The client's whole body (empty when it has none), or the error its failure is answered with; a
 * promise chain rather than an `async` function, one layer less on every small request.
 */
function _readBody(request: Request): Promise<Uint8Array | _RouterError> {
  return request.body ? request.bytes().catch(_clientFailed) : Promise.resolve(new Uint8Array(0));
}

/** A body already read whole (at most one data frame), sent as one frame; its byte count. */
async function _sendBytes(
  bytes: Uint8Array,
  exchange: TunnelExchange,
  trace: _Trace,
): Promise<number> {
  if (bytes.length > 0) {
    const frame = exchange.upload.newFrame(bytes.length);
    frame.set(bytes, DATA_HEADER_BYTES);
    await exchange.upload.sendFilled(frame, bytes.length);
  }
  trace.requestBytes = exchange.upload.sentBytes;
  return bytes.length;
}

/**
 * Reads the client's body straight into data frames (a BYOB read fills each frame's payload in
 * place: reading a large body chunk by chunk costs far more) and sends them; the byte count, or
 * the error to answer.
 */
async function _sendBody(
  body: ReadableStream<Uint8Array>,
  exchange: TunnelExchange,
  length: number | null,
  limit: number,
  trace: _Trace,
  bodyWatch?: StallWatch,
): Promise<number | _RouterError> {
  const tooLarge = () =>
    new _RouterError(413, "request_too_large", "request body is too large", "request_rejected");
  let byob: ReadableStreamBYOBReader | null = null;
  try {
    byob = body.getReader({ mode: "byob" });
  } catch {
    // not a byte stream: chunk by chunk below
  }
  let total = 0;
  if (!byob) {
    for await (const chunk of body) {
      total += chunk.length;
      if (total > limit) return tooLarge();
      await exchange.upload.write(chunk);
      trace.requestBytes = exchange.upload.sentBytes;
    }
    return total;
  }
  // A body that stops arriving is cut (its reader cancelled): 408, and the slot is discarded.
  const reader = byob;
  let stalled = false;
  const watched = bodyWatch?.watch(() => {
    stalled = true;
    reader.cancel().catch(() => {});
  });
  try {
    for (let done = false; !done;) {
      // Sized to the rest of a body of known length (+1: the read that sees its end).
      let frame = exchange.upload.newFrame(
        length === null ? MAX_DATA_BYTES : Math.max(length - total, 0) + 1,
      );
      const capacity = frame.length - DATA_HEADER_BYTES;
      let filled = 0;
      while (filled < capacity) {
        let read: ReadableStreamReadResult<Uint8Array>;
        try {
          read = await byob.read(
            new Uint8Array(frame.buffer, DATA_HEADER_BYTES + filled, capacity - filled),
          );
        } catch {
          return stalled ? _bodyTimeout(bodyWatch!.timeoutMs) : _clientFailed();
        }
        if (stalled) return _bodyTimeout(bodyWatch!.timeoutMs);
        watched?.progress();
        if (read.value) {
          frame = new Uint8Array(read.value.buffer as ArrayBuffer); // the same memory, new owner
          filled += read.value.length;
        }
        if (read.done) {
          done = true;
          break;
        }
      }
      total += filled;
      if (total > limit) return tooLarge();
      if (filled > 0) await exchange.upload.sendFilled(frame, filled);
      trace.requestBytes = exchange.upload.sentBytes;
    }
    return total;
  } finally {
    watched?.done();
    byob.releaseLock();
  }
}

/**
 * What a cut-short answer's stream fails with. `Deno.serve` prints the error of an answer's
 * stream on stderr, whatever it is (a stack trace for an `Error`), among the console's event
 * lines; the attempt's own `request_finished` line already gives the reason, so the value is
 * empty (at most a blank line, which a JSON-lines reader skips).
 */
const _CUT_SHORT = "";

/** The node's body for the client; the slot's fate is settled when it ends either way. */
function _responseBody(
  exchange: TunnelExchange,
  interrupted: Promise<_RouterError>,
  lease: SlotLease,
  trace: _Trace,
  ctx: ForwardContext,
): ReadableStream<Uint8Array> {
  const reader = exchange.body.stream.getReader();
  // An upload failing while the answer streams ends the answer (the client sees it cut).
  let settled = false;
  const settle = (reason: FinishReason, reusable: boolean, cancel?: FinishReason) => {
    if (settled) return;
    settled = true;
    _settle(exchange, lease, trace, ctx, reason, reusable, cancel);
  };
  // The chunk last handed to the client's answer: once the answer asks for the next one, the
  // server has passed it to its write (which holds its own reference), and its memory goes
  // back at once instead of at a collection (protocol/bytes.ts says why).
  let handed: Uint8Array | null = null;
  const release = () => {
    if (handed) releaseBuffer(handed);
    handed = null;
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      release();
      let next: ReadableStreamReadResult<Uint8Array> | _RouterError;
      try {
        next = await Promise.race([reader.read(), interrupted]);
      } catch (error) {
        // The slot failed mid-answer: the client's body is cut short.
        const reason = error instanceof TunnelError ? error.reason : "tunnel_disconnected";
        settle(reason, false);
        controller.error(_CUT_SHORT);
        return;
      }
      if (next instanceof _RouterError) {
        settle(next.reason, false, next.reason);
        controller.error(_CUT_SHORT);
        return;
      }
      if (next.done) {
        // The client's answer is complete first (the bookkeeping and its log line come after).
        controller.close();
        if (!settled) (settled = true, _answered(exchange, lease, trace, ctx));
        return;
      }
      trace.responseBytes += next.value.length;
      controller.enqueue(next.value);
      handed = next.value;
    },
    cancel() {
      settle("client_disconnected", false, "client_disconnected");
    },
  }, { highWaterMark: 0 });
}
