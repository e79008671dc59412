/**
 * The supervisor owns its server's whole process tree (spec router §5.1, §5.5): the child runs
 * in a process group (and session) of its own, and every descendant is found and killed before
 * a new generation starts or the supervisor exits, including descendants that left the group
 * with `setsid()`.
 *
 * The supervisor is a Linux child subreaper (`prctl` through FFI), so orphans are re-parented to
 * it; a scan of `/proc` from the child and from the supervisor (orphans that carry
 * {@linkcode TREE_MARKER_VARIABLE} or were seen before) finds the tree. Each pid is killed only
 * while it keeps the start time it was seen with, and reaped with `waitpid(pid, WNOHANG)`, never
 * `waitpid(-1)` (that would take Deno's own child's status). Without FFI the tree falls back to
 * the process group and the pids it saw, without `/proc` to the group alone (a log line says so).
 *
 * ```
 *   spawn ─▶ running ──exit on its own──────────────────────┐
 *              │                                            ▼
 *              └─ terminate(grace): SIGTERM, wait ≤ grace ─▶ cleanup(): SIGKILL what is left
 *                   └─ timeout: SIGKILL descendants,          every 10 ms for ≤ 5 s, reap
 *                      group and child, wait                  orphans; survivors ─▶ error
 * ```
 *
 * @module
 */
import { sleepUnlessAborted } from "../../link/backoff.ts";
import { errorMessage } from "../../protocol/errors.ts";

/** The server command a supervisor runs. */
export interface ChildCommand {
  /** The program. */
  command: string;
  /** Its arguments. */
  args: string[];
  /** Variables added to the supervisor's own environment. */
  env: Record<string, string>;
}

/** How a {@linkcode ProcessTree} runs its child. */
export interface ProcessTreeOptions {
  /** The child's stdout and stderr: the supervisor's (default) or `/dev/null`. */
  stdio?: "inherit" | "null";
  /** Where log lines go; default none. */
  log?: (line: string) => void;
}

/**
 * The variable a tree's child gets (a fresh id per tree), inherited by its descendants, by
 * which re-parented orphans are recognised as the tree's.
 */
export const TREE_MARKER_VARIABLE = "KCORAL_SUPERVISOR_TREE";

/** How long {@linkcode ProcessTree.cleanup} keeps killing descendants before giving up. */
const _CLEANUP_LIMIT_MS = 5000;

/**
 * Descendants of the server survived 5 s of SIGKILLs: the supervisor exits with an error rather
 * than start a second tree alongside them.
 */
export class DescendantsSurvivedError extends Error {
  /** The pids still alive. */
  readonly pids: number[];
  /** Creates the error. */
  constructor(pids: number[]) {
    super(
      `server descendants did not exit; refusing to restart alongside them (pids ${
        pids.join(", ")
      })`,
    );
    this.name = "DescendantsSurvivedError";
    this.pids = pids;
  }
}

/** Whether this process is a child subreaper, and if not why. */
export interface SubreaperState {
  /** Orphaned descendants are re-parented to this process. */
  readonly enabled: boolean;
  /** Why not, when not enabled; `""` otherwise. */
  readonly reason: string;
}

const LIBC_SYMBOLS = {
  prctl: { parameters: ["i32", "u64", "u64", "u64", "u64"], result: "i32" },
  waitpid: { parameters: ["i32", "buffer", "i32"], result: "i32" },
} as const;

const PR_SET_CHILD_SUBREAPER = 36;
const WNOHANG = 1;

let libc: Deno.DynamicLibrary<typeof LIBC_SYMBOLS> | null = null;
let subreaper: SubreaperState | null = null;

/**
 * Makes this process a child subreaper (once; later calls return the first outcome). Needs
 * Linux and `--allow-ffi`; otherwise `enabled` is `false` and `reason` says why.
 */
export function enableChildSubreaper(): SubreaperState {
  if (subreaper !== null) return subreaper;
  if (Deno.build.os !== "linux") {
    return subreaper = { enabled: false, reason: `not on Linux (${Deno.build.os})` };
  }
  try {
    libc = Deno.dlopen("libc.so.6", LIBC_SYMBOLS);
  } catch (error) {
    return subreaper = { enabled: false, reason: `no FFI: ${errorMessage(error)}` };
  }
  const result = libc.symbols.prctl(PR_SET_CHILD_SUBREAPER, 1n, 0n, 0n, 0n);
  subreaper = result === 0
    ? { enabled: true, reason: "" }
    : { enabled: false, reason: "prctl(PR_SET_CHILD_SUBREAPER) failed" };
  return subreaper;
}

/** One process as `/proc/<pid>/stat` shows it. */
interface ProcInfo {
  pid: number;
  ppid: number;
  /** `R`, `S`, `Z`, ... */
  state: string;
  /** Start time since boot, in clock ticks: with the pid, the process's identity. */
  start: string;
}

function readStat(pid: number): ProcInfo | null {
  let text: string;
  try {
    text = Deno.readTextFileSync(`/proc/${pid}/stat`);
  } catch {
    return null;
  }
  // The command name (field 2) is in parentheses and may contain anything.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { pid, state: fields[0], ppid: Number(fields[1]), start: fields[19] };
}

/** How descendants are found: `children` files, a full `/proc` scan, or not at all. */
let scanMode: "children" | "stat" | { none: string } | null = null;

function detectScanMode(): "children" | "stat" | { none: string } {
  try {
    for (const task of Deno.readDirSync(`/proc/${Deno.pid}/task`)) {
      try {
        Deno.statSync(`/proc/${Deno.pid}/task/${task.name}/children`);
        return "children";
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
        break;
      }
    }
    Deno.readDirSync("/proc");
    return "stat";
  } catch (error) {
    return { none: errorMessage(error) };
  }
}

/** The children of each of `pids`, from their tasks' `children` files or a full scan. */
function childrenOf(pids: number[]): Map<number, number[]> {
  const result = new Map<number, number[]>();
  for (const pid of pids) result.set(pid, []);
  if (scanMode === "children") {
    for (const pid of pids) {
      const children = result.get(pid)!;
      try {
        for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
          try {
            const text = Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/children`);
            for (const word of text.split(" ")) if (word !== "") children.push(Number(word));
          } catch { /* the task ended */ }
        }
      } catch { /* the process ended */ }
    }
  } else if (scanMode === "stat") {
    for (const entry of Deno.readDirSync("/proc")) {
      if (!/^\d+$/.test(entry.name)) continue;
      const info = readStat(Number(entry.name));
      if (info !== null) result.get(info.ppid)?.push(info.pid);
    }
  }
  return result;
}

function hasMarker(pid: number, marker: string): boolean {
  try {
    const environ = Deno.readTextFileSync(`/proc/${pid}/environ`);
    return `\0${environ}`.includes(`\0${marker}\0`);
  } catch {
    return false;
  }
}

function sendSignal(pid: number, signal: Deno.Signal): void {
  try {
    Deno.kill(pid, signal);
  } catch { /* already gone */ }
}

/** A spawned server and everything it starts (see the module documentation). */
export class ProcessTree {
  /** The child's pid (also its process group's id). */
  readonly pid: number;
  /** Resolves with the child's exit status once it has exited (never rejects). */
  readonly exited: Promise<Deno.CommandStatus>;
  readonly #marker: string;
  readonly #log: (line: string) => void;
  readonly #known = new Map<number, string>();
  #status: Deno.CommandStatus | null = null;

  private constructor(child: Deno.ChildProcess, marker: string, log: (line: string) => void) {
    this.#marker = marker;
    this.#log = log;
    this.pid = child.pid;
    this.exited = child.status.then((status) => this.#status = status);
  }

  /**
   * Spawns `command` with stdin from `/dev/null`, in a process group and session of its own,
   * after making this process a subreaper (a log line says so when that is not possible).
   * Throws what `Deno.Command.spawn` throws (`Deno.errors.NotFound`, ...).
   */
  static spawn(command: ChildCommand, options: ProcessTreeOptions = {}): ProcessTree {
    const log = options.log ?? (() => {});
    const state = enableChildSubreaper();
    if (scanMode === null) {
      scanMode = detectScanMode();
      if (!state.enabled) {
        log(
          `process tree: cannot become a child subreaper (${state.reason}); ` +
            "falling back to process-group kill",
        );
      }
      if (typeof scanMode === "object") {
        log(`process tree: cannot read /proc (${scanMode.none}); only the process group is killed`);
      }
    }
    const marker = `${TREE_MARKER_VARIABLE}=${crypto.randomUUID()}`;
    const stdio = options.stdio ?? "inherit";
    const child = new Deno.Command(command.command, {
      args: command.args,
      env: { ...command.env, [TREE_MARKER_VARIABLE]: marker.split("=")[1] },
      stdin: "null",
      stdout: stdio,
      stderr: stdio,
      detached: true,
    }).spawn();
    return new ProcessTree(child, marker, log);
  }

  /** The child's exit status, or `null` while it runs. */
  get exitStatus(): Deno.CommandStatus | null {
    return this.#status;
  }

  /** The pids of the child's living descendants (the child itself not included), found now. */
  descendants(): number[] {
    return [...this.#scan().values()].filter((p) => p.state !== "Z").map((p) => p.pid);
  }

  /**
   * Sends SIGTERM to the child and waits for it to exit: without limit when `graceSeconds` is
   * `null` (a normal shutdown lets requests finish), else at most `graceSeconds`, after which
   * the descendants, the process group and the child get SIGKILL. Resolves with the child's
   * exit status. Call {@linkcode ProcessTree.cleanup} afterwards.
   */
  async terminate(graceSeconds: number | null): Promise<Deno.CommandStatus> {
    if (this.#status !== null) return this.#status;
    this.#scan(); // remember who is in the tree before anything is re-parented
    sendSignal(this.pid, "SIGTERM");
    if (graceSeconds === null) return await this.exited;
    const stop = new AbortController();
    const timedOut = await Promise.race([
      this.exited.then(() => false),
      sleepUnlessAborted(graceSeconds * 1000, stop.signal),
    ]);
    stop.abort();
    if (timedOut && this.#status === null) {
      this.#log("child did not stop after SIGTERM; sending SIGKILL");
      this.#killAll();
    }
    return await this.exited;
  }

  /**
   * Sends SIGKILL to the descendants, the process group and the child at once, and waits for
   * the child to exit.
   */
  async kill(): Promise<Deno.CommandStatus> {
    if (this.#status === null) this.#killAll();
    return await this.exited;
  }

  /**
   * After the child has exited: sends SIGKILL to every remaining descendant (and the process
   * group) every 10 ms, reaping orphans re-parented to this process, until none is left;
   * throws {@linkcode DescendantsSurvivedError} if some are still alive after 5 s.
   * Waits for the child's exit first.
   */
  async cleanup(): Promise<void> {
    await this.exited;
    const deadline = Date.now() + _CLEANUP_LIMIT_MS;
    for (let round = 0;; round++) {
      // Without the subreaper or /proc, descendants may be out of sight: the group gets SIGKILL.
      if (round === 0 && (subreaper?.enabled !== true || typeof scanMode === "object")) {
        sendSignal(-this.pid, "SIGKILL");
      }
      const found = this.#scan();
      const alive = this.#reap(found);
      if (alive.length === 0) return;
      if (Date.now() >= deadline) throw new DescendantsSurvivedError(alive);
      if (round === 0) this.#log(`killing ${alive.length} remaining server descendant(s)`);
      sendSignal(-this.pid, "SIGKILL");
      for (const pid of alive) sendSignal(pid, "SIGKILL");
      await sleepUnlessAborted(10);
    }
  }

  /** SIGKILL to the descendants, the group and the child. */
  #killAll(): void {
    const found = this.#scan();
    sendSignal(-this.pid, "SIGKILL");
    for (const info of found.values()) if (info.state !== "Z") sendSignal(info.pid, "SIGKILL");
    sendSignal(this.pid, "SIGKILL");
  }

  /**
   * Reaps the zombies among `found` that are this process's (re-parented) children; returns the
   * pids still alive.
   */
  #reap(found: Map<number, ProcInfo>): number[] {
    const alive: number[] = [];
    const status = new Int32Array(1);
    for (const info of found.values()) {
      if (info.state !== "Z") {
        alive.push(info.pid);
      } else if (info.ppid === Deno.pid && info.pid !== this.pid && libc !== null) {
        libc.symbols.waitpid(info.pid, new Uint8Array(status.buffer), WNOHANG);
      }
    }
    return alive;
  }

  /**
   * Every descendant found now (the child excluded), zombies included: the child's subtree,
   * orphans of the tree re-parented to this process, and pids seen before that still run.
   */
  #scan(): Map<number, ProcInfo> {
    const found = new Map<number, ProcInfo>();
    const add = (info: ProcInfo | null): boolean => {
      if (info === null || info.pid === this.pid || found.has(info.pid)) return false;
      found.set(info.pid, info);
      this.#known.set(info.pid, info.start);
      return true;
    };
    const roots = [Deno.pid];
    if (this.#status === null) roots.push(this.pid);
    const rootChildren = childrenOf(roots);
    let frontier: number[] = [];
    for (const pid of rootChildren.get(this.pid) ?? []) {
      if (add(readStat(pid))) frontier.push(pid);
    }
    for (const pid of rootChildren.get(Deno.pid) ?? []) {
      if (pid === this.pid || found.has(pid)) continue;
      const info = readStat(pid);
      if (info === null) continue;
      const ours = this.#known.get(pid) === info.start || hasMarker(pid, this.#marker);
      if (ours && add(info)) frontier.push(pid);
    }
    for (const [pid, start] of this.#known) {
      if (found.has(pid)) continue;
      const info = readStat(pid);
      if (info !== null && info.start === start && add(info)) frontier.push(pid);
      else if (info === null || info.start !== start) this.#known.delete(pid);
    }
    while (frontier.length > 0) {
      const next: number[] = [];
      for (const children of childrenOf(frontier).values()) {
        for (const pid of children) if (add(readStat(pid))) next.push(pid);
      }
      frontier = next;
    }
    return found;
  }
}
