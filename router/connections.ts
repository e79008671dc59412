/**
 * A node's connections as the Router's registry holds them (spec router §1.5, §2.3–§2.4): the
 * handles the socket layer implements (a supervisor's control connection, a data slot), the
 * refusal that closes one, a node's slots (registered by slot id, the idle ones in a FIFO) and
 * the lease a request holds on one. Every check compares connection ids, so a late close of an
 * old connection never removes its replacement.
 *
 * @module
 */
import type { LinkCloseName } from "../link/messages.ts";

/** The registry's view of one connected data slot; `router/slot_link.ts` implements it. */
export interface SlotHandle {
  /** Unique per WebSocket connection. */
  readonly connectionId: string;
  /** The slot id of the hello (new on every connection of the node). */
  readonly slotId: string;
  /** The node of the hello. */
  readonly nodeId: string;
  /** The server instance of the hello. */
  readonly serverInstanceId: string;
  /** Closes the connection with a node-link close code and reason; idempotent, never blocks. */
  close(code: LinkCloseName, reason: string): void;
}

/** One control connection (a supervisor's WebSocket). */
export interface ControlHandle {
  /** Unique per WebSocket connection. */
  readonly connectionId: string;
  /** Closes the connection with a node-link close code and reason; idempotent, never blocks. */
  close(code: LinkCloseName, reason: string): void;
}

/**
 * A connection is refused or ended: close it with `code` and `message`.
 *
 * @example
 * ```ts
 * import { LinkRefusal } from "./connections.ts";
 *
 * const refusal = new LinkRefusal("already_exists", "data slot identifier is already connected");
 * if (refusal.code !== "already_exists" || refusal.name !== "LinkRefusal") throw new Error();
 * ```
 */
export class LinkRefusal extends Error {
  /** The close code to use. */
  readonly code: LinkCloseName;
  /** Creates the refusal. */
  constructor(code: LinkCloseName, message: string) {
    super(message);
    this.name = "LinkRefusal";
    this.code = code;
  }
}

/** A slot taken for one request. */
export interface SlotLease {
  /** The node that serves the request. */
  readonly nodeId: string;
  /** The slot carrying it. */
  readonly slot: SlotHandle;
  /**
   * Gives the slot back: `reusable` true puts it at the back of the node's idle FIFO (only if it
   * is still the registered connection for its slot id and the node's current server instance
   * is the slot's); false discards it (unregisters it; the caller closes it). Decrements
   * `in_flight` and wakes one waiter. Idempotent.
   */
  release(reusable: boolean): void;
  /**
   * The node answered 503: exclude it from scheduling and capacity for one status-check
   * interval (cleared early by its next healthy report).
   */
  markSaturated(): void;
}

/**
 * A node's data slots: the registered connections by slot id (idle and busy), and the idle ones
 * oldest first.
 */
export class NodeSlots {
  readonly #byId = new Map<string, SlotHandle>();
  /** Idle slot ids, oldest first. */
  #idle: string[] = [];

  /** Registered slots, idle and busy. */
  get size(): number {
    return this.#byId.size;
  }

  /** Idle slots. */
  get idleCount(): number {
    return this.#idle.length;
  }

  /** Whether a connection is registered for `slotId`. */
  has(slotId: string): boolean {
    return this.#byId.has(slotId);
  }

  /** Registers `slot`, idle, at the back of the FIFO (its slot id is not registered yet). */
  add(slot: SlotHandle): void {
    this.#byId.set(slot.slotId, slot);
    this.#idle.push(slot.slotId);
  }

  /** Takes the oldest idle slot out of the FIFO (it stays registered); there must be one. */
  takeIdle(): SlotHandle {
    return this.#byId.get(this.#idle.shift()!)!;
  }

  /**
   * Unregisters `slot` if it is still the registered connection for its slot id; whether it was.
   */
  remove(slot: SlotHandle): boolean {
    if (!this.#registered(slot)) return false;
    this.#byId.delete(slot.slotId);
    this.#idle = this.#idle.filter((id) => id !== slot.slotId);
    return true;
  }

  /**
   * A leased slot comes back. Still registered, `reusable` and of the node's current server
   * instance (`serverInstanceId`): idle again at the back of the FIFO. Otherwise it is
   * unregistered, never idle again (and closed when it was reusable but of a replaced instance).
   */
  giveBack(slot: SlotHandle, reusable: boolean, serverInstanceId: string): void {
    if (!this.#registered(slot)) return;
    if (reusable && serverInstanceId === slot.serverInstanceId) {
      this.#idle.push(slot.slotId);
      return;
    }
    this.#byId.delete(slot.slotId);
    if (reusable) slot.close("unavailable", "KCoral Server instance changed");
  }

  /** Unregisters every slot; returns them, for the caller to close. */
  clear(): SlotHandle[] {
    const slots = [...this.#byId.values()];
    this.#byId.clear();
    this.#idle = [];
    return slots;
  }

  #registered(slot: SlotHandle): boolean {
    return this.#byId.get(slot.slotId)?.connectionId === slot.connectionId;
  }
}
