/**
 * Test helper: a node that speaks the node link by hand (link/messages.ts), for Router
 * tests that need a node to misbehave, answer early, stall or report other versions. Real nodes
 * (supervisor + server) are in tests/_router.ts.
 */
import {
  CONTROL_PATH,
  CREDIT_WINDOW,
  encodeMessage,
  MAX_DATA_BYTES,
  type NodeStatus,
  parseSlotMessage,
  PROTOCOL_VERSION,
  type RequestHead,
  SLOT_PATH,
  type SlotCancel,
} from "../link/messages.ts";
import { decodeRequestFrame, encodeFrame } from "../link/frames.ts";

const _closeInfo = new WeakMap<WebSocket, { code: number; reason: string }>();

/** Opens a WebSocket to `path` of the Router and resolves once it is open. */
export async function openLink(
  routerUrl: string,
  path: string,
  token: string | null = null,
): Promise<WebSocket> {
  const headers: Record<string, string> = {};
  if (token !== null) headers.authorization = `Bearer ${token}`;
  const socket = new WebSocket(
    routerUrl.replace(/^http/, "ws") + path,
    { headers } as unknown as string[],
  );
  socket.binaryType = "arraybuffer";
  socket.addEventListener("close", (event) => {
    _closeInfo.set(socket, { code: event.code, reason: event.reason });
  });
  await new Promise<void>((resolve, reject) => {
    socket.onopen = () => resolve();
    socket.onerror = (event) => reject(new Error((event as ErrorEvent).message));
  });
  return socket;
}

/** The next message of `socket` (or its close, as `{ closed: code, reason }`). */
export function nextMessage(
  socket: WebSocket,
  timeoutMs = 10_000,
): Promise<string | ArrayBuffer | { closed: number; reason: string }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no message in time")), timeoutMs);
    socket.onmessage = (event) => {
      clearTimeout(timer);
      socket.onmessage = null;
      socket.onclose = null;
      resolve(event.data);
    };
    socket.onclose = (event) => {
      clearTimeout(timer);
      socket.onmessage = null;
      resolve({ closed: event.code, reason: event.reason });
    };
    const seen = _closeInfo.get(socket);
    if (seen) resolve({ closed: seen.code, reason: seen.reason });
  });
}

/** Resolves with the close code and reason of `socket`. */
export function closed(socket: WebSocket): Promise<{ code: number; reason: string }> {
  const seen = _closeInfo.get(socket);
  if (seen) return Promise.resolve(seen);
  return new Promise((resolve) => {
    socket.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason }));
  });
}

/** A healthy status report for `nodeId`. */
export function healthyStatus(
  nodeId: string,
  overrides: Partial<NodeStatus> = {},
): NodeStatus {
  return {
    t: "status",
    node_id: nodeId,
    server_healthy: true,
    supervisor_instance_id: "sup-" + nodeId,
    server_instance_id: "srv-" + nodeId,
    worker_count: 1,
    busy_workers: 0,
    target: {},
    versions: { python: "3.11" },
    last_error: "",
    health_age_millis: 0,
    ...overrides,
  };
}

/** One request as a fake node sees it. */
export interface FakeRequest {
  /** The Router's request id. */
  id: string;
  head: RequestHead;
  /** Reads the whole body (granting credit as it goes). */
  body(): Promise<Uint8Array>;
  /** Sends the response head, alone in its frame. */
  respond(status: number, headers?: [string, string][]): void;
  /** Sends body bytes in frames, within the Router's credit. */
  write(bytes: Uint8Array): Promise<void>;
  /** Sends the end, alone in its frame. */
  end(): void;
  /** Sends the head, the body and the end in one frame. */
  respondComplete(status: number, headers: [string, string][], body: Uint8Array): void;
  /** The request came in one frame (head, body and end). */
  cameInOneFrame: boolean;
  socket: WebSocket;
}

/** A fake node: a control connection with heartbeats and slots driven by `handler`. */
export class FakeNode {
  readonly nodeId: string;
  readonly routerUrl: string;
  readonly sockets: WebSocket[] = [];
  /** The `cancel` messages the Router sent to this node's slots. */
  readonly cancels: SlotCancel[] = [];
  status: NodeStatus;
  #heartbeat: ReturnType<typeof setInterval> | undefined;
  #control: WebSocket | null = null;

  constructor(routerUrl: string, nodeId: string, status: Partial<NodeStatus> = {}) {
    this.routerUrl = routerUrl;
    this.nodeId = nodeId;
    this.status = healthyStatus(nodeId, status);
  }

  /** Opens the control connection, reports, waits for the ack, heartbeats every 100 ms. */
  async connect(token: string | null = null): Promise<void> {
    const socket = await openLink(this.routerUrl, CONTROL_PATH, token);
    this.#control = socket;
    this.sockets.push(socket);
    socket.send(encodeMessage(this.status));
    const ack = await nextMessage(socket);
    if (ack !== '{"t":"ack"}') throw new Error(`no ack: ${JSON.stringify(ack)}`);
    this.#heartbeat = setInterval(() => {
      if (socket.readyState === WebSocket.OPEN) socket.send(encodeMessage(this.status));
    }, 100);
  }

  /** Sends the current status at once. */
  report(): void {
    this.#control?.send(encodeMessage(this.status));
  }

  /**
   * Opens a slot whose requests go to `handler` (its hello of `protocolVersion`); resolves once
   * acknowledged.
   */
  async openSlot(
    handler: (request: FakeRequest) => void | Promise<void>,
    token: string | null = null,
    protocolVersion = PROTOCOL_VERSION,
  ): Promise<WebSocket> {
    const socket = await openLink(this.routerUrl, SLOT_PATH, token);
    this.sockets.push(socket);
    socket.send(encodeMessage({
      t: "hello",
      node_id: this.nodeId,
      server_instance_id: this.status.server_instance_id,
      slot_id: crypto.randomUUID(),
      protocol_version: protocolVersion,
    }));
    const ack = await nextMessage(socket);
    if (ack !== '{"t":"ack"}') throw new Error(`no ack: ${JSON.stringify(ack)}`);
    let current: { chunks: Uint8Array[]; done: () => void; ended: Promise<void> } | null = null;
    let read = 0;
    let credit = CREDIT_WINDOW;
    let creditCame: (() => void) | null = null;
    const begin = (id: string, head: RequestHead, cameInOneFrame: boolean) => {
      let done!: () => void;
      const ended = new Promise<void>((resolve) => (done = resolve));
      current = { chunks: [], done, ended };
      read = 0;
      credit = CREDIT_WINDOW;
      const state = current;
      handler({
        id,
        head,
        socket,
        cameInOneFrame,
        async body() {
          await state.ended;
          const out = new Uint8Array(state.chunks.reduce((n, c) => n + c.length, 0));
          let at = 0;
          for (const chunk of state.chunks) (out.set(chunk, at), at += chunk.length);
          return out;
        },
        respond(status, headers = []) {
          socket.send(encodeFrame(id, { status, headers }, new Uint8Array(0), false));
        },
        async write(bytes) {
          for (let at = 0; at < bytes.length; at += MAX_DATA_BYTES) {
            while (credit === 0) await new Promise<void>((resolve) => (creditCame = resolve));
            credit--;
            socket.send(encodeFrame(id, null, bytes.subarray(at, at + MAX_DATA_BYTES), false));
          }
        },
        end() {
          socket.send(encodeFrame(id, null, new Uint8Array(0), true));
        },
        respondComplete(status, headers, body) {
          socket.send(encodeFrame(id, { status, headers }, body, true));
        },
      });
      return state;
    };
    socket.onmessage = (event) => {
      if (event.data instanceof ArrayBuffer) {
        const frame = decodeRequestFrame(new Uint8Array(event.data));
        const state = frame.head ? begin(frame.requestId, frame.head, frame.end) : current;
        if (frame.bytes.length > 0) {
          state?.chunks.push(frame.bytes.slice());
          if (!frame.end && ++read >= CREDIT_WINDOW / 2) {
            socket.send(encodeMessage({ t: "credit", request_id: frame.requestId, frames: read }));
            read = 0;
          }
        }
        if (frame.end) state?.done();
        return;
      }
      const message = parseSlotMessage(event.data as string);
      if (message.t === "cancel") {
        this.cancels.push(message);
      } else if (message.t === "credit") {
        credit += message.frames;
        creditCame?.();
        creditCame = null;
      }
    };
    return socket;
  }

  /** Closes every connection. */
  close(): void {
    clearInterval(this.#heartbeat);
    for (const socket of this.sockets) {
      try {
        socket.close();
      } catch {
        // already closed
      }
    }
  }
}
