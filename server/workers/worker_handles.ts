/**
 * What the rest of the server uses of a slot (a zygote) and a worker child, as interfaces:
 * server/workers/slot.ts implements them over real processes, tests with fakes.
 *
 * @module
 */
import type { Frame } from "./ipc.ts";
import type { ChildCommand } from "./worker_protocol.ts";

/** What a zygote says once its imports are done. */
export interface ZygoteHello {
  pid: number;
  python: string;
  versions: Record<string, string>;
  mode: string;
  /** `performance.now()` minus the zygote's monotonic clock (ms), refined by fork round trips. */
  clockOffsetMs: number;
}

/** What a child reports once initialized. */
export interface ChildReady {
  target: Record<string, string>;
  versions: Record<string, string>;
  deviceUuids: string[];
  /** GPU and simulated workers: the context is `"created"` or `"deferred"` to the first lease. */
  context?: "created" | "deferred";
}

/** How a child is initialized. */
export interface ChildInit {
  /** Learn the devices only: no context, so neither lease nor initialization gate is needed. */
  deferContext?: boolean;
}

/** How a child ended. */
export interface ChildExit {
  code: number | null;
  signal: number | null;
  /** Descendants outlived the child and were killed. */
  orphans: boolean;
  /** The whole slot (zygote) died; the child is gone with it. */
  slotDied: boolean;
  /** The instruction the child last started, from the page it shares with its zygote. */
  instruction?: number | null;
}

/** What a run needs of a child: frames both ways, its exit, a kill. */
export interface ChildChannel {
  /** Sends a frame to the child; a `run` frame's program goes as its binary `tail`. */
  send(frame: ChildCommand, tail?: Uint8Array): void;
  /** Routes the child's frames to `handler` (`null`: hold them until one is set). */
  setHandler(handler: ((frame: Frame) => void) | null): void;
  /** The child's exit, for one wait (call `stop` when done with it). */
  watchExit(): { exited: Promise<ChildExit>; stop: () => void };
  /** Kills the child's process tree; resolves once it is gone. */
  kill(graceSeconds: number): Promise<ChildExit>;
  /** Resolves once the child (and every descendant) is gone. */
  readonly exited: Promise<ChildExit>;
  /** Ends the child's whole slot (its zygote stopped answering); resolves once it is gone. */
  destroySlot(): Promise<void>;
}

/** What the pool and dispatch use of a worker child: its {@linkcode ChildChannel} and lifecycle. */
export interface SeatChild extends ChildChannel {
  /** Its pid (in its zygote's pid namespace). */
  readonly pid: number;
  /** How it ended, once it has. */
  readonly exit: ChildExit | null;
  /** Creates its device context (under the lease), or with `deferContext` only finds devices. */
  init(options?: ChildInit): Promise<ChildReady>;
  /** Diagnostics and the clock alignment of the slot that forked it. */
  readonly slot: {
    readonly stderrSeen: number;
    stderrTail(since?: number): string;
    readonly hello: ZygoteHello | null;
  };
}

/** What the pool uses of a slot (a zygote). {@linkcode Slot} is the real one; tests use fakes. */
export interface SeatSlot {
  /** The zygote's pid (also its process group id). */
  readonly pid: number;
  /** Whether the zygote has died. */
  readonly dead: boolean;
  /** The last bytes the zygote wrote to stderr (diagnostics). */
  stderrTail(): string;
  /** Resolves when the zygote process has exited. */
  readonly closed: Promise<unknown>;
  /** Forks a child with extra environment. */
  fork(
    options: { env?: Record<string, string>; unset?: string[]; maxRequests: number },
  ): Promise<SeatChild>;
  /** Binds workspace `name` at `/work` for the next request (sandboxed slots). */
  switchWorkspace(name: string): void;
  /** Stops every child and the zygote. */
  stop(graceMs?: number): Promise<void>;
  /** Kills the zygote's whole process group at once. */
  destroy(): void;
}
