/**
 * The node link's messages: what a Router and its nodes say over the WebSockets the nodes open
 * (upstream carries the same semantics over gRPC: spec router §1), as JSON text. Bodies and the
 * heads that begin them travel in binary frames (link/frames.ts). No I/O here.
 *
 * Two kinds of connection, both `GET` upgrades on the Router's one port, both with
 * `Authorization: Bearer <token>` when the Router has a token (checked before the upgrade; a
 * wrong or missing token is a 401 and nothing is read):
 *
 * ```
 * control  /kcoral/v1/control   one per node supervisor
 *   node ─▶ router   status (a full snapshot: on every change and every heartbeat)
 *   router ─▶ node   ack (exactly once, after the first status), then nothing
 *
 * slot     /kcoral/v1/slot      one per worker of the node's server
 *   node ─▶ router   hello                       router ─▶ node   ack
 *   then, one request at a time, each naming the Router's request id:
 *   router ─▶ node   frames: the request head, its body, its end  (or cancel, at any time)
 *   node ─▶ router   frames: the response head, its body, its end
 *   either way       credit (the receiver of body bytes grants more frames)
 * ```
 *
 * A sender may have {@linkcode CREDIT_WINDOW} frames of body bytes unacknowledged; the receiver
 * returns credit as it consumes them, so neither end buffers more than a window per request and
 * direction (a WebSocket has no back-pressure of its own). The slot is reusable once both ends
 * have passed; a `cancel` or any violation ends the connection, and the node opens a new one.
 * Failures close the WebSocket with one of {@linkcode LINK_CLOSE} and a reason.
 *
 * @module
 */
/**
 * The node-link protocol version a slot's `hello` must carry: 2 since a head, its first body
 * bytes and the end travel in one kind of binary frame (link/frames.ts); a slot of version 1 (text
 * heads and ends) is refused with `failed_precondition`.
 */
export const PROTOCOL_VERSION = 2;
/** The most body bytes one frame carries (256 KiB, as upstream's slot frames). */
export const MAX_DATA_BYTES = 262144;
/** Frames with body bytes of one body a sender may have unacknowledged. */
export const CREDIT_WINDOW = 16;
/** How long the Router waits for a connection's first message. */
export const FIRST_MESSAGE_TIMEOUT_MS = 10_000;
/** The largest text message either end accepts, and the largest head a frame carries, in bytes. */
export const MAX_TEXT_BYTES = 1 << 20;
/** The path of the supervisor's control connection. */
export const CONTROL_PATH = "/kcoral/v1/control";
/** The path of one worker slot's data connection. */
export const SLOT_PATH = "/kcoral/v1/slot";
/** The header a client names its preferred node with, and the Router names the node that served. */
export const NODE_HEADER = "x-kcoral-node";

/**
 * WebSocket close codes of the node link, named after the gRPC statuses upstream uses for the
 * same cases (spec router §1.4–§1.5).
 *
 * @example
 * ```ts
 * import { LINK_CLOSE } from "./messages.ts";
 *
 * if (LINK_CLOSE.invalid_argument !== 4003) throw new Error();
 * ```
 */
export const LINK_CLOSE = {
  /** A malformed message, a wrong first message, an invalid node id or report. */
  invalid_argument: 4003,
  /** No first message within {@linkcode FIRST_MESSAGE_TIMEOUT_MS}. */
  deadline_exceeded: 4004,
  /** The slot id is already connected for this node. */
  already_exists: 4006,
  /** Wrong protocol version; a slot of another server instance; a superseded connection. */
  failed_precondition: 4009,
  /** The Router discards the slot (the reason says why: `client_disconnected`, ...). */
  cancelled: 4010,
  /** The node's server or supervisor instance changed, or its record expired. */
  unavailable: 4014,
  /** The Router or the node is stopping. */
  shutting_down: 1001,
} as const;

/** A name of {@linkcode LINK_CLOSE}. */
export type LinkCloseName = keyof typeof LINK_CLOSE;

const _CANCEL_REASONS = [
  "client_disconnected",
  "request_rejected",
  "invalid_response",
  "tunnel_disconnected",
] as const;

/** Why the Router discards a slot (spec router §1.5). */
export type CancelReason = typeof _CANCEL_REASONS[number];

/** One HTTP header, `[name, value]`; repeated names stay separate entries. */
export type HeaderEntry = [string, string];

/** A supervisor's snapshot of its node (spec router §1.4). */
export interface NodeStatus {
  /** `"status"`. */
  t: "status";
  /** The node's stable name ({@linkcode isValidNodeId}). */
  node_id: string;
  /** The last local health probe succeeded. */
  server_healthy: boolean;
  /** New on every supervisor start. */
  supervisor_instance_id: string;
  /** The server's `instance_id` (new on every server start); `""` before the first probe. */
  server_instance_id: string;
  /** The server's workers. */
  worker_count: number;
  /** Of which busy. */
  busy_workers: number;
  /** The server's compilation target. */
  target: Record<string, string>;
  /** The server's runtime versions. */
  versions: Record<string, string>;
  /** Why the server is unhealthy (`""` when healthy). */
  last_error: string;
  /** Age of the last successful probe when sent, in ms; `null` when never probed. */
  health_age_millis: number | null;
}

/** The Router's one answer on a control connection, or to a slot's `hello`. */
export interface LinkAck {
  /** `"ack"`. */
  t: "ack";
}

/** A slot's first message. */
export interface SlotHello {
  /** `"hello"`. */
  t: "hello";
  /** The node's name. */
  node_id: string;
  /** The server instance the slot belongs to. */
  server_instance_id: string;
  /** New on every connection. */
  slot_id: string;
  /** {@linkcode PROTOCOL_VERSION}. */
  protocol_version: number;
}

/** Router → node: a request begins (the head of its first frame, link/frames.ts). */
export interface RequestHead {
  /** The forwarded request headers. */
  headers: HeaderEntry[];
  /** The client's declared `Content-Length`, or `null`. */
  content_length: number | null;
}

/** Node → router: the answer begins (possibly before the request body has ended). */
export interface ResponseHead {
  /** HTTP status, 200–599. */
  status: number;
  /** The response headers. */
  headers: HeaderEntry[];
}

/** Router → node: discard the request and the slot. */
export interface SlotCancel {
  /** `"cancel"`. */
  t: "cancel";
  /** The request. */
  request_id: string;
  /** Why. */
  reason: CancelReason;
}

/** The receiver of a body grants the sender `frames` more frames of body bytes. */
export interface Credit {
  /** `"credit"`. */
  t: "credit";
  /** The request. */
  request_id: string;
  /** How many more, at least 1. */
  frames: number;
}

/** A text message on a slot connection. */
export type SlotMessage = SlotHello | LinkAck | SlotCancel | Credit;

/** A text message on a control connection. */
export type ControlMessage = NodeStatus | LinkAck;

/** A message that cannot be read; the connection is closed with `invalid_argument`. */
export class LinkMessageError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "LinkMessageError";
  }
}

const _NODE_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const _UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * A node id is 1–64 characters, the first ASCII alphanumeric, the rest alphanumeric or `_ . -`
 * (spec router §1.3).
 */
export function isValidNodeId(value: unknown): value is string {
  return typeof value === "string" && _NODE_ID.test(value);
}

/** The `Authorization` header value a node sends for `token`. */
export function bearer(token: string): string {
  return `Bearer ${token}`;
}

/**
 * Whether an `Authorization` header value carries `token`, compared in constant time (the time
 * depends on the lengths only). With no token configured (`null`) every node is accepted.
 */
export function bearerMatches(header: string | null, token: string | null): boolean {
  if (token === null) return true;
  if (header === null || !header.startsWith("Bearer ")) return false;
  const given = new TextEncoder().encode(header.slice(7));
  const expected = new TextEncoder().encode(token);
  let diff = given.length ^ expected.length;
  for (let i = 0; i < expected.length; i++) diff |= expected[i] ^ (given[i % given.length] ?? 0);
  return diff === 0 && given.length > 0;
}

/**
 * The error for an empty `KCORAL_NODE_TOKEN` (Router and routed node alike): a token that is
 * set must not be empty; unset the variable for no token.
 */
export const EMPTY_NODE_TOKEN_VARIABLE =
  "KCORAL_NODE_TOKEN must not be empty (unset it for no token)";

/** Encodes a text message. */
export function encodeMessage(
  message: SlotMessage | ControlMessage | RequestHead | ResponseHead,
): string {
  return JSON.stringify(message);
}

function _object(text: string): Record<string, unknown> {
  if (text.length > MAX_TEXT_BYTES) throw new LinkMessageError("message too large");
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new LinkMessageError("message is not JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new LinkMessageError("message is not a JSON object");
  }
  return value as Record<string, unknown>;
}

function _isStrMap(value: unknown): value is Record<string, string> {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    Object.values(value).every((v) => typeof v === "string");
}

function _isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

function _isHeaders(value: unknown): value is HeaderEntry[] {
  return Array.isArray(value) &&
    value.every((h) =>
      Array.isArray(h) && h.length === 2 && typeof h[0] === "string" && typeof h[1] === "string" &&
      h[0].length > 0
    );
}

function _requestId(m: Record<string, unknown>): string {
  if (typeof m.request_id !== "string" || !_UUID.test(m.request_id)) {
    throw new LinkMessageError(`'${m.t}' without a request id`);
  }
  return m.request_id;
}

/**
 * Reads a text message of a control connection; throws {@linkcode LinkMessageError} for
 * anything else. The report's own rules (a healthy report's instance id, capacity and age) are
 * the Router's: see `router/registry.ts`.
 */
export function parseControlMessage(text: string): ControlMessage {
  const m = _object(text);
  if (m.t === "ack") return { t: "ack" };
  if (m.t !== "status") throw new LinkMessageError(`unexpected control message '${m.t}'`);
  const problems: string[] = [];
  if (typeof m.node_id !== "string") problems.push("node_id");
  if (typeof m.server_healthy !== "boolean") problems.push("server_healthy");
  if (typeof m.supervisor_instance_id !== "string") problems.push("supervisor_instance_id");
  if (typeof m.server_instance_id !== "string") problems.push("server_instance_id");
  if (!_isCount(m.worker_count)) problems.push("worker_count");
  if (!_isCount(m.busy_workers)) problems.push("busy_workers");
  if (!_isStrMap(m.target)) problems.push("target");
  if (!_isStrMap(m.versions)) problems.push("versions");
  if (typeof m.last_error !== "string") problems.push("last_error");
  if (m.health_age_millis !== null && !_isCount(m.health_age_millis)) {
    problems.push("health_age_millis");
  }
  if (problems.length > 0) {
    throw new LinkMessageError(`status with a malformed ${problems.join(", ")}`);
  }
  return {
    t: "status",
    node_id: m.node_id as string,
    server_healthy: m.server_healthy as boolean,
    supervisor_instance_id: m.supervisor_instance_id as string,
    server_instance_id: m.server_instance_id as string,
    worker_count: m.worker_count as number,
    busy_workers: m.busy_workers as number,
    target: m.target as Record<string, string>,
    versions: m.versions as Record<string, string>,
    last_error: m.last_error as string,
    health_age_millis: m.health_age_millis as number | null,
  };
}

/**
 * Reads a request head (the JSON of a frame's head, Router → node); throws
 * {@linkcode LinkMessageError} unless it has header entries and a `content_length` that is a
 * length or `null`.
 */
export function parseRequestHead(text: string): RequestHead {
  const m = _object(text);
  if (!_isHeaders(m.headers)) throw new LinkMessageError("request head with malformed headers");
  if (m.content_length !== null && !_isCount(m.content_length)) {
    throw new LinkMessageError("request head with a malformed content_length");
  }
  return { headers: m.headers, content_length: m.content_length };
}

/**
 * Reads a response head (the JSON of a frame's head, node → Router); throws
 * {@linkcode LinkMessageError} unless it has a status of 200–599 and header entries.
 */
export function parseResponseHead(text: string): ResponseHead {
  const m = _object(text);
  if (!_isCount(m.status) || m.status < 200 || m.status > 599) {
    throw new LinkMessageError("response head with an invalid status");
  }
  if (!_isHeaders(m.headers)) throw new LinkMessageError("response head with malformed headers");
  return { status: m.status, headers: m.headers };
}

/**
 * Reads a text message of a slot connection; throws {@linkcode LinkMessageError} for anything
 * else (which message may come when is the connection's state machine's to check).
 */
export function parseSlotMessage(text: string): SlotMessage {
  const m = _object(text);
  switch (m.t) {
    case "ack":
      return { t: "ack" };
    case "hello":
      if (
        typeof m.node_id !== "string" || typeof m.server_instance_id !== "string" ||
        typeof m.slot_id !== "string" || !_isCount(m.protocol_version)
      ) throw new LinkMessageError("malformed hello");
      return {
        t: "hello",
        node_id: m.node_id,
        server_instance_id: m.server_instance_id,
        slot_id: m.slot_id,
        protocol_version: m.protocol_version,
      };
    case "cancel": {
      const request_id = _requestId(m);
      if (!_CANCEL_REASONS.includes(m.reason as CancelReason)) {
        throw new LinkMessageError("cancel with an unknown reason");
      }
      return { t: "cancel", request_id, reason: m.reason as CancelReason };
    }
    case "credit": {
      const request_id = _requestId(m);
      if (!_isCount(m.frames) || m.frames < 1 || m.frames > 1 << 20) {
        throw new LinkMessageError("credit with an invalid frame count");
      }
      return { t: "credit", request_id, frames: m.frames };
    }
    default:
      throw new LinkMessageError(`unexpected slot message '${String(m.t)}'`);
  }
}
