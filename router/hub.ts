/**
 * Where nodes connect: the WebSocket upgrades on {@linkcode CONTROL_PATH} and
 * {@linkcode SLOT_PATH} (spec router §1.2–§1.5, over link/messages.ts), answered by the
 * link's own WebSocket endpoint (link/websocket_server.ts): a message over its limit (text
 * {@linkcode MAX_TEXT_BYTES}, binary `MAX_FRAME_BYTES`) is refused at its frame header.
 *
 * ```
 *  GET upgrade ─▶ token (constant time; 401 before anything is read) ─▶ WebSocket (101)
 *  control: first message within 10 s: status ─▶ registry ─▶ ack; later statuses ─▶ registry
 *  slot:    first message within 10 s: hello (version 2) ─▶ registry ─▶ ack ─▶ RouterSlot
 *  a refusal or a malformed message ─▶ closed with its code and reason
 *  a message over the limit, a frame against RFC 6455 ─▶ closed (1009, 1002, 1007), logged
 * ```
 *
 * @module
 */
import {
  bearerMatches,
  CONTROL_PATH,
  encodeMessage,
  FIRST_MESSAGE_TIMEOUT_MS,
  type LinkCloseName,
  LinkMessageError,
  MAX_TEXT_BYTES,
  parseControlMessage,
  parseSlotMessage,
  PROTOCOL_VERSION,
  SLOT_PATH,
} from "../link/messages.ts";
import { MAX_FRAME_BYTES } from "../link/frames.ts";
import {
  type ServerWebSocket,
  upgradeWebSocket,
  WebSocketHandshakeError,
} from "../link/websocket_server.ts";
import type { EventLog } from "../http/events.ts";
import { jsonResponse } from "../http/routes.ts";
import { type ControlHandle, LinkRefusal } from "./connections.ts";
import type { NodeRegistry } from "./registry.ts";
import { closeLink, RouterSlot } from "./slot_link.ts";

/** What the hub needs of the Router. */
export interface HubContext {
  /** Nodes and slots. */
  registry: NodeRegistry;
  /** The node token, or `null` to accept every node. */
  nodeToken: string | null;
  /** Where refusals are logged. */
  events: EventLog;
  /** Open node connections, so that a stop can close them. */
  sockets: Set<ServerWebSocket>;
}

/**
 * A node link's limits: its messages (a text message, a frame of the node link), and a ping
 * after 30 s of silence (closed when that goes unanswered as long).
 */
const _LINK_LIMITS = {
  maxTextBytes: MAX_TEXT_BYTES,
  maxBinaryBytes: MAX_FRAME_BYTES,
  idleTimeoutMs: 30_000,
};

/** Answers a node's upgrade request on the control or slot path. */
export function acceptNodeLink(request: Request, ctx: HubContext): Response {
  // The token comes first: nothing else of an unauthenticated peer is read.
  if (!bearerMatches(request.headers.get("authorization"), ctx.nodeToken)) {
    return _refuseUpgrade(request, ctx, 401, "unauthenticated", "invalid node bearer token");
  }
  if (request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
    return new Response('{"detail":"Upgrade Required"}', {
      status: 426,
      headers: { "content-type": "application/json", upgrade: "websocket" },
    });
  }
  let upgraded: { socket: ServerWebSocket; response: Response };
  try {
    upgraded = upgradeWebSocket(request, _LINK_LIMITS);
  } catch (error) {
    if (!(error instanceof WebSocketHandshakeError)) throw error;
    const message = `invalid WebSocket handshake: ${error.message}`;
    const response = _refuseUpgrade(request, ctx, error.status, "invalid_request", message);
    if (error.status === 426) response.headers.set("sec-websocket-version", "13");
    return response;
  }
  const { socket, response } = upgraded;
  ctx.sockets.add(socket);
  // A frame against the protocol, or a message over the limit (refused at its header).
  socket.onerror = (event) =>
    ctx.events.emit("WARNING", "node_link_refused", {
      link: _linkName(request),
      code: event.code === 1009 ? "message_too_big" : "protocol_error",
      reason: event.message,
    });
  const path = new URL(request.url).pathname;
  if (path === CONTROL_PATH) _control(socket, ctx);
  else if (path === SLOT_PATH) _slot(socket, ctx);
  else socket.onopen = () => closeLink(socket, "invalid_argument", "unknown node link path");
  return response;
}

/** An upgrade refused before the handshake: logged, and answered with `status`. */
function _refuseUpgrade(
  request: Request,
  ctx: HubContext,
  status: number,
  kind: string,
  message: string,
): Response {
  const link = _linkName(request);
  ctx.events.emit("WARNING", "node_link_refused", { link, code: kind, reason: message });
  return jsonResponse(status, JSON.stringify({ status: "ERROR", error: { kind, message } }));
}

/** Which link a refused request asked for, for its `node_link_refused` event. */
function _linkName(request: Request): "control" | "slot" {
  return new URL(request.url).pathname === CONTROL_PATH ? "control" : "slot";
}

function _firstMessageTimer(socket: ServerWebSocket): ReturnType<typeof setTimeout> {
  return setTimeout(
    () => closeLink(socket, "deadline_exceeded", "no first message in time"),
    FIRST_MESSAGE_TIMEOUT_MS,
  );
}

function _refused(
  ctx: HubContext,
  socket: ServerWebSocket,
  error: unknown,
  fields: object,
): void {
  const [code, message]: [LinkCloseName, string] = error instanceof LinkRefusal
    ? [error.code, error.message]
    : ["invalid_argument", (error as Error).message];
  ctx.events.emit("WARNING", "node_link_refused", { ...fields, code, reason: message });
  closeLink(socket, code, message);
}

function _control(socket: ServerWebSocket, ctx: HubContext): void {
  const handle: ControlHandle = {
    connectionId: crypto.randomUUID(),
    close: (code, reason) => closeLink(socket, code, reason),
  };
  let registered = false;
  let nodeId = "";
  const timer = _firstMessageTimer(socket);
  socket.onmessage = (event) => {
    try {
      if (typeof event.data !== "string") {
        throw new LinkMessageError("binary message on a control connection");
      }
      const message = parseControlMessage(event.data);
      if (message.t !== "status") throw new LinkMessageError("a node does not send 'ack'");
      ctx.registry.controlStatus(handle, message, !registered);
      if (!registered) {
        registered = true;
        nodeId = message.node_id;
        clearTimeout(timer);
        socket.send(encodeMessage({ t: "ack" }));
      }
    } catch (error) {
      if (!(error instanceof LinkMessageError || error instanceof LinkRefusal)) throw error;
      _refused(ctx, socket, error, { link: "control", node: nodeId });
    }
  };
  socket.onclose = () => {
    clearTimeout(timer);
    ctx.sockets.delete(socket);
    if (registered) ctx.registry.controlClosed(handle);
  };
}

function _slot(socket: ServerWebSocket, ctx: HubContext): void {
  let slot: RouterSlot | null = null;
  const timer = _firstMessageTimer(socket);
  socket.onmessage = (event) => {
    if (slot) {
      slot.receive(event.data);
      return;
    }
    try {
      if (typeof event.data !== "string") throw new LinkMessageError("the first message is hello");
      const hello = parseSlotMessage(event.data);
      if (hello.t !== "hello") throw new LinkMessageError("the first message is hello");
      clearTimeout(timer);
      if (hello.protocol_version !== PROTOCOL_VERSION) {
        throw new LinkRefusal(
          "failed_precondition",
          `unsupported node link protocol version ${hello.protocol_version}`,
        );
      }
      const candidate = new RouterSlot(socket, hello, (s) => ctx.registry.slotClosed(s));
      ctx.registry.registerSlot(hello, candidate);
      slot = candidate;
      socket.send(encodeMessage({ t: "ack" }));
    } catch (error) {
      if (!(error instanceof LinkMessageError || error instanceof LinkRefusal)) throw error;
      _refused(ctx, socket, error, { link: "slot" });
    }
  };
  socket.onclose = (event) => {
    clearTimeout(timer);
    ctx.sockets.delete(socket);
    slot?.closedBySocket(event.reason || "connection closed");
  };
}
