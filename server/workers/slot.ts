/**
 * One worker slot: a long-lived Python zygote (sandboxed when isolation is on) that forks a fresh
 * child per worker generation and relays the children's frames over its pipes. Slot and child
 * share one module: every frame, exit and kill of a child passes through its slot's state.
 *
 * @module
 */
import { encodeFrame, type Frame, readFrames } from "./ipc.ts";
import { monotonicOffsetMs } from "./monotonic_clock.ts";
import type {
  ChildExit,
  ChildInit,
  ChildReady,
  SeatChild,
  SeatSlot,
  ZygoteHello,
} from "./worker_handles.ts";
import { FrameShapeError, parseZygoteReport } from "./worker_protocol.ts";

/** How to start a slot's zygote. */
export interface SlotCommand {
  /** Executable (python, or bwrap). */
  command: string;
  /** Its arguments. */
  args: string[];
  /** Environment of the zygote (complete; nothing is inherited). */
  env: Record<string, string>;
  /** Working directory. */
  cwd?: string;
  /** Largest frame taken from the zygote (default `MAX_FRAME_BYTES`); a larger one ends it. */
  maxFrameBytes?: number;
}

/** The zygote stopped answering or died while starting. */
export class SlotError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "SlotError";
  }
}

/** A child process ended before answering. */
export class ChildExited extends Error {
  /** How it ended. */
  readonly exit: ChildExit;
  /** Creates the error. */
  constructor(exit: ChildExit) {
    super(
      exit.slotDied
        ? "worker slot died"
        : `worker exited (code ${exit.code}, signal ${exit.signal})`,
    );
    this.name = "ChildExited";
    this.exit = exit;
  }
}

const _STDERR_RING = 8192;

/** A forked worker process of a slot. */
export class WorkerChild implements SeatChild {
  /** The id the server chose (unique within the slot). */
  readonly id: number;
  /** The slot that forked it. */
  readonly slot: Slot;
  /** Its pid (in the zygote's pid namespace). */
  pid = 0;
  /** Set once `ready` arrived. */
  ready: ChildReady | null = null;
  /** Resolves when the child and all its descendants are gone. */
  readonly exited: Promise<ChildExit>;
  /** The exit, once known. */
  exit: ChildExit | null = null;
  #resolveExit!: (exit: ChildExit) => void;
  #exitWatchers = new Set<(exit: ChildExit) => void>();
  #handler: ((frame: Frame) => void) | null = null;
  #pending: Frame[] = [];

  /** @internal */
  constructor(slot: Slot, id: number) {
    this.slot = slot;
    this.id = id;
    this.exited = new Promise((resolve) => (this.#resolveExit = resolve));
  }

  /**
   * The child's exit for one wait that may end otherwise (call `stop` after): racing the
   * long-lived {@linkcode exited} itself would keep each request alive until the child exits.
   */
  watchExit(): { exited: Promise<ChildExit>; stop: () => void } {
    if (this.exit) return { exited: Promise.resolve(this.exit), stop: () => {} };
    let resolve!: (exit: ChildExit) => void;
    const exited = new Promise<ChildExit>((r) => (resolve = r));
    this.#exitWatchers.add(resolve);
    return { exited, stop: () => void this.#exitWatchers.delete(resolve) };
  }

  /** Sends a frame to the child (through the zygote), with its binary `tail` if any. */
  send(frame: Omit<Frame, "c">, tail?: Uint8Array): void {
    this.slot.send({ ...frame, c: this.id } as Frame, tail);
  }

  /** Routes frames of this child to `handler` (or queues them until one is set). */
  setHandler(handler: ((frame: Frame) => void) | null): void {
    this.#handler = handler;
    if (handler) {
      const pending = this.#pending;
      this.#pending = [];
      for (const frame of pending) handler(frame);
    }
  }

  /** Waits for the next frame of one of `types`, failing if the child exits first. */
  async next(types: string[], onOther?: (frame: Frame) => void): Promise<Frame> {
    if (this.exit) throw new ChildExited(this.exit);
    let settle!: (frame: Frame) => void;
    const frame = new Promise<Frame>((resolve) => (settle = resolve));
    this.setHandler((f) => {
      if (types.includes(f.t)) settle(f);
      else onOther?.(f);
    });
    const watch = this.watchExit();
    try {
      const winner = await Promise.race([frame, watch.exited]);
      if ("t" in winner) return winner as Frame;
      throw new ChildExited(winner as ChildExit);
    } finally {
      watch.stop();
      this.setHandler(null);
    }
  }

  /** Creates the device context (under the lease), or with `deferContext` only finds devices. */
  async init(options: ChildInit = {}): Promise<ChildReady> {
    const reply = this.next(["ready", "init_failed"]);
    this.send(options.deferContext ? { t: "init", context: false } : { t: "init" });
    const frame = await reply;
    if (frame.t === "init_failed") {
      throw new SlotError(
        `worker initialization failed: ${frame.message}\n${frame.traceback ?? ""}`.trim(),
      );
    }
    this.ready = {
      target: (frame.target ?? {}) as Record<string, string>,
      versions: (frame.versions ?? {}) as Record<string, string>,
      deviceUuids: (frame.device_uuids ?? []) as string[],
    };
    if (frame.context === "created" || frame.context === "deferred") {
      this.ready.context = frame.context;
    }
    return this.ready;
  }

  /** Ends the child's whole slot (its zygote stopped answering); resolves once it is gone. */
  async destroySlot(): Promise<void> {
    this.slot.destroy();
    await this.slot.closed;
  }

  /** Asks the zygote to kill the child's process tree; resolves when it is gone. */
  kill(graceSeconds: number): Promise<ChildExit> {
    if (!this.exit) this.slot.send({ t: "kill", c: this.id, grace: graceSeconds });
    return this.exited;
  }

  /** @internal */
  _deliver(frame: Frame): void {
    if (this.#handler) this.#handler(frame);
    else this.#pending.push(frame);
  }

  /** @internal */
  _exited(exit: ChildExit): void {
    if (this.exit) return;
    this.exit = exit;
    this.#resolveExit(exit);
    for (const watcher of this.#exitWatchers) watcher(exit);
    this.#exitWatchers.clear();
  }
}

/** One slot: its zygote process and children. */
export class Slot implements SeatSlot {
  /** Stable seat name, e.g. `gpu0/w3` or `cpu/w1`. */
  readonly label: string;
  /** Set once the zygote said hello. */
  hello: ZygoteHello | null = null;
  /** Resolves when the zygote process has exited. */
  readonly closed: Promise<Deno.CommandStatus>;
  #process: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #children = new Map<number, WorkerChild>();
  #forks = new Map<number, (pid: number) => void>();
  /** When each pending fork was asked for (`performance.now()`), for the clock alignment. */
  #forkAsked = new Map<number, number>();
  /** The shortest fork round trip so far (ms): its midpoint aligns the clocks best. */
  #bestRoundTripMs = Infinity;
  #nextChild = 1;
  #stderr = new Uint8Array(0);
  #stderrSeen = 0;
  #helloWaiter: { resolve: (h: ZygoteHello) => void; reject: (e: Error) => void } | null = null;
  #dead = false;
  #fatal: string | null = null;

  private constructor(label: string, process: Deno.ChildProcess, maxFrameBytes?: number) {
    this.label = label;
    this.#process = process;
    this.#writer = process.stdin.getWriter();
    this.closed = process.status;
    this.#readStderr(process.stderr);
    this.#readFrames(process.stdout, maxFrameBytes);
  }

  /** Starts a zygote (leading its own process group) and waits up to `timeoutMs` for `hello`. */
  static async start(label: string, spec: SlotCommand, timeoutMs = 120_000): Promise<Slot> {
    const process = new Deno.Command(spec.command, {
      args: spec.args,
      env: spec.env,
      clearEnv: true,
      cwd: spec.cwd,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
      detached: true,
    }).spawn();
    const slot = new Slot(label, process, spec.maxFrameBytes);
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        new Promise<ZygoteHello>((resolve, reject) => (slot.#helloWaiter = { resolve, reject })),
        new Promise((_, reject) => {
          timer = setTimeout(
            () => reject(new SlotError(`worker ${label} did not start within ${timeoutMs} ms`)),
            timeoutMs,
          );
        }),
      ]);
    } catch (error) {
      slot.destroy();
      throw error;
    } finally {
      clearTimeout(timer);
    }
    return slot;
  }

  /** The zygote's pid (also its process group id). */
  get pid(): number {
    return this.#process.pid;
  }

  /** Whether the zygote has died. */
  get dead(): boolean {
    return this.#dead;
  }

  /** Bytes written to stderr so far (a mark for {@linkcode stderrTail}). */
  get stderrSeen(): number {
    return this.#stderrSeen;
  }

  /** The last bytes written to stderr; with `since` (a {@linkcode stderrSeen}), those after. */
  stderrTail(since?: number): string {
    const fresh = since === undefined ? this.#stderr.length : this.#stderrSeen - since;
    return new TextDecoder().decode(
      this.#stderr.subarray(Math.max(0, this.#stderr.length - fresh)),
    );
  }

  /** Sends a raw frame to the zygote, with its binary `tail` if any. */
  send(frame: Frame, tail?: Uint8Array): void {
    if (this.#dead) return;
    this.#writer.write(encodeFrame(frame, tail)).catch(() => {});
  }

  /** Forks a child with extra environment; resolves once the zygote reports its pid. */
  async fork(
    options: { env?: Record<string, string>; unset?: string[]; maxRequests: number },
  ): Promise<WorkerChild> {
    if (this.#dead) throw new SlotError(this.#deathMessage());
    const id = this.#nextChild++;
    const child = new WorkerChild(this, id);
    this.#children.set(id, child);
    const forked = new Promise<number>((resolve) => this.#forks.set(id, resolve));
    this.#forkAsked.set(id, performance.now());
    this.send({
      t: "fork",
      c: id,
      env: options.env ?? {},
      unset: options.unset ?? [],
      max_requests: options.maxRequests,
    });
    const pid = await Promise.race([forked, child.exited.then(() => -1)]);
    this.#forks.delete(id);
    this.#forkAsked.delete(id);
    if (pid < 0) throw new ChildExited(child.exit!);
    child.pid = pid;
    return child;
  }

  /**
   * Has a sandboxed zygote bind workspace `name` at `/work`; frames are handled in order, and a
   * zygote that cannot switch exits rather than run a program elsewhere.
   */
  switchWorkspace(name: string): void {
    this.send({ t: "workspace", name });
  }

  /** Asks the zygote to kill every child and exit, then kills the process group (by `graceMs`). */
  async stop(graceMs = 5000): Promise<void> {
    this.send({ t: "shutdown" });
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.closed, new Promise((r) => (timer = setTimeout(r, graceMs)))]);
    clearTimeout(timer);
    this.destroy();
    await this.closed;
  }

  /** Kills the zygote's whole process group at once (SIGKILL). */
  destroy(): void {
    try {
      Deno.kill(-this.#process.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }

  #deathMessage(): string {
    return `worker slot ${this.label} died${this.#fatal ? `: ${this.#fatal}` : ""}`;
  }

  async #readFrames(stdout: ReadableStream<Uint8Array>, maxBytes?: number): Promise<void> {
    try {
      for await (const frame of readFrames(stdout, maxBytes)) this.#onFrame(frame);
    } catch (error) {
      this.#fatal ??= `bad frame from worker: ${error}`;
    }
    this.#dead = true;
    this.destroy();
    const tail = this.stderrTail().trim();
    this.#helloWaiter?.reject(
      new SlotError(`${this.#deathMessage()}${tail ? `\n${tail}` : ""}`),
    );
    this.#helloWaiter = null;
    for (const child of this.#children.values()) {
      child._exited({ code: null, signal: null, orphans: false, slotDied: true });
    }
    this.#children.clear();
    try {
      await this.#writer.close();
    } catch {
      // broken pipe
    }
  }

  async #readStderr(stderr: ReadableStream<Uint8Array>): Promise<void> {
    try {
      for await (const chunk of stderr) {
        this.#stderrSeen += chunk.length;
        const joined = new Uint8Array(this.#stderr.length + chunk.length);
        joined.set(this.#stderr);
        joined.set(chunk, this.#stderr.length);
        this.#stderr = joined.length > _STDERR_RING ? joined.slice(-_STDERR_RING) : joined;
      }
    } catch {
      // process gone
    }
  }

  #onFrame(raw: Frame): void {
    if (raw.child === true) {
      // A child's frame tagged by the zygote (its "c" wins): only that child's, never the zygote's.
      this.#children.get(Number(raw.c))?._deliver(raw);
      return;
    }
    let frame;
    try {
      frame = parseZygoteReport(raw);
    } catch (error) {
      if (!(error instanceof FrameShapeError)) throw error;
      // The zygote broke the protocol: nothing it says can be trusted any more.
      this.#fatal ??= error.message;
      this.destroy();
      return;
    }
    switch (frame.t) {
      case "hello":
        this.hello = {
          pid: frame.pid,
          python: frame.python,
          versions: frame.versions,
          mode: frame.mode,
          // Exact with FFI; else an estimate the fastest fork round trip refines.
          clockOffsetMs: monotonicOffsetMs() ?? performance.now() - frame.monotonic_ns / 1e6,
        };
        this.#helloWaiter?.resolve(this.hello);
        this.#helloWaiter = null;
        return;
      case "error":
        this.#fatal = frame.message;
        return;
      case "forked": {
        const asked = this.#forkAsked.get(frame.c);
        if (
          asked !== undefined && this.hello && typeof frame.monotonic_ns === "number" &&
          monotonicOffsetMs() === null
        ) {
          const now = performance.now();
          if (now - asked < this.#bestRoundTripMs) {
            this.#bestRoundTripMs = now - asked;
            this.hello.clockOffsetMs = (asked + now) / 2 - frame.monotonic_ns / 1e6;
          }
        }
        this.#forks.get(frame.c)?.(frame.pid);
        return;
      }
      case "exited": {
        const child = this.#children.get(frame.c);
        if (!child) return;
        this.#children.delete(frame.c);
        child._exited({
          code: frame.code,
          signal: frame.signal,
          orphans: frame.orphans,
          slotDied: false,
          instruction: frame.instr ?? null,
        });
        return;
      }
    }
  }
}
