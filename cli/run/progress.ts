/**
 * The one-line progress display of `kcoral run` on a terminal: one stderr line rewritten
 * in place with `\r`, erased before the remote output is replayed. When stderr is not a
 * terminal it writes nothing at all.
 *
 * @module
 */

/** Options of {@linkcode Progress}. */
export interface ProgressOptions {
  /** Writes text to the terminal (stderr). */
  write: (text: string) => void;
  /** Whether stderr is a terminal; when false the display is disabled. */
  isTerminal: boolean;
  /** Terminal width; longer lines are cut to `columns - 1` characters. */
  columns?: number;
  /** Clock in milliseconds (default `Date.now`). */
  now?: () => number;
  /** Least time between two lazy renders, in milliseconds (default 100). */
  intervalMs?: number;
  /**
   * Nothing is shown until this many milliseconds after construction (default 0), so
   * quick steps do not flicker.
   */
  delayMs?: number;
}

/**
 * A single progress line. `update` rewrites it (lazily: at most once per `intervalMs`
 * unless forced; never before `delayMs`), `clear` erases it. Both do nothing when
 * disabled.
 *
 * @example
 * ```ts
 * import { Progress } from "./progress.ts";
 * let shown = "";
 * const progress = new Progress({ write: (text) => shown += text, isTerminal: true });
 * progress.update("kcoral: packing inputs: 1 file, 12 B", { force: true });
 * progress.clear();
 * shown; // "\rkcoral: packing inputs: 1 file, 12 B\x1b[K\r\x1b[K"
 * ```
 */
export class Progress {
  readonly #write: (text: string) => void;
  readonly #enabled: boolean;
  readonly #columns: number | undefined;
  readonly #now: () => number;
  readonly #intervalMs: number;
  readonly #visibleAt: number;
  #shown = false;
  #ended = false;
  #last = -Infinity;
  #text = "";

  /** Create the display; nothing is written yet. */
  constructor(options: ProgressOptions) {
    this.#write = options.write;
    this.#enabled = options.isTerminal;
    this.#columns = options.columns;
    this.#now = options.now ?? Date.now;
    this.#intervalMs = options.intervalMs ?? 100;
    this.#visibleAt = this.#now() + (options.delayMs ?? 0);
  }

  /** Whether anything is ever written (stderr is a terminal). */
  get enabled(): boolean {
    return this.#enabled;
  }

  /**
   * Show `text` (one line, no newline). Skipped before `delayMs`, and, without `force`,
   * less than `intervalMs` after the previous render; an identical line is not rewritten.
   */
  update(text: string, options: { force?: boolean } = {}): void {
    if (!this.#enabled || this.#ended) return;
    const now = this.#now();
    if (now < this.#visibleAt) return;
    if (!options.force && now - this.#last < this.#intervalMs) return;
    const line = this.#columns !== undefined && this.#columns > 1
      ? [...text].slice(0, this.#columns - 1).join("")
      : text;
    if (this.#shown && line === this.#text) return;
    this.#last = now;
    this.#text = line;
    this.#shown = true;
    this.#write(`\r${line}\x1b[K`);
  }

  /** Erase the line if one is shown (before the remote output or a diagnostic). */
  clear(): void {
    if (!this.#shown) return;
    this.#shown = false;
    this.#text = "";
    this.#write("\r\x1b[K");
  }

  /**
   * Erase the line and show none again: the remote output has begun, and a status line drawn
   * over its last, unfinished line would garble it.
   *
   * @example
   * ```ts
   * import { Progress } from "./progress.ts";
   *
   * let shown = "";
   * const progress = new Progress({ write: (text) => shown += text, isTerminal: true });
   * progress.update("kcoral: running, 1 s", { force: true });
   * progress.end();
   * progress.update("kcoral: running, 2 s", { force: true });
   * shown; // "\rkcoral: running, 1 s\x1b[K\r\x1b[K"
   * ```
   */
  end(): void {
    this.clear();
    this.#ended = true;
  }
}

/**
 * A byte count for people: `512 B`, `1.5 KiB`, `12.0 MiB`, `2.0 GiB`.
 *
 * @example
 * ```ts
 * import { formatBytes } from "./progress.ts";
 * formatBytes(1536); // "1.5 KiB"
 * ```
 */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}

/**
 * Elapsed time in whole seconds: `7 s`, `2 min 05 s`.
 *
 * @example
 * ```ts
 * import { formatElapsed } from "./progress.ts";
 * formatElapsed(125_400); // "2 min 05 s"
 * ```
 */
export function formatElapsed(milliseconds: number): string {
  const seconds = Math.max(0, Math.floor(milliseconds / 1000));
  if (seconds < 60) return `${seconds} s`;
  return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
}

/**
 * The packing line: `kcoral: packing inputs: 3 files, 1.5 KiB`.
 *
 * @example
 * ```ts
 * import { describePacking } from "./progress.ts";
 * describePacking(1, 12); // "kcoral: packing inputs: 1 file, 12 B"
 * ```
 */
export function describePacking(files: number, bytes: number): string {
  return `kcoral: packing inputs: ${files} file${files === 1 ? "" : "s"}, ${formatBytes(bytes)}`;
}

/**
 * The transfer line of a large upload or download: bytes so far of the total, percent and the
 * mean rate since it began.
 *
 * @example
 * ```ts
 * import { describeTransfer } from "./progress.ts";
 *
 * const line = describeTransfer("upload", 128 * 1048576, 256 * 1048576, 500);
 * if (line !== "kcoral: uploading 128.0 MiB of 256.0 MiB (50%), 256.0 MiB/s") throw new Error(line);
 * ```
 */
export function describeTransfer(
  direction: "upload" | "download",
  bytes: number,
  total: number,
  elapsedMs: number,
): string {
  const verb = direction === "upload" ? "uploading" : "downloading";
  const percent = total > 0 ? Math.floor((100 * bytes) / total) : 100;
  const rate = elapsedMs > 0 ? `, ${formatBytes(Math.round((bytes * 1000) / elapsedMs))}/s` : "";
  return `kcoral: ${verb} ${formatBytes(bytes)} of ${formatBytes(total)} (${percent}%)${rate}`;
}

/** Transfers smaller than this show no transfer line (the waiting line goes on). */
export const TRANSFER_LINE_BYTES = 1 << 20;

/**
 * The transfer line of `kcoral run`: bytes, percent and rate while a large body moves (the
 * client's `onProgress` feeds it); {@linkcode TransferLine.active} tells the waiting line to
 * stay away meanwhile. Bodies under {@linkcode TRANSFER_LINE_BYTES} show nothing.
 *
 * @example
 * ```ts
 * import { Progress, TransferLine } from "./progress.ts";
 *
 * let clock = 0;
 * let shown = "";
 * const progress = new Progress({ write: (t) => (shown = t), isTerminal: true, now: () => clock });
 * const line = new TransferLine(progress, () => clock);
 * line.update({ direction: "upload", bytes: 0, total: 8 << 20 });
 * clock = 1000;
 * line.update({ direction: "upload", bytes: 4 << 20, total: 8 << 20 });
 * if (!line.active || !shown.includes("uploading 4.0 MiB of 8.0 MiB (50%), 4.0 MiB/s")) {
 *   throw new Error(shown);
 * }
 * ```
 */
export class TransferLine {
  readonly #progress: Progress;
  readonly #now: () => number;
  #direction: "upload" | "download" | null = null;
  #started = 0;
  /** Whether bytes are moving now. */
  active = false;

  /** A line on `progress`; `now` is the clock in milliseconds (default `Date.now`). */
  constructor(progress: Progress, now: () => number = Date.now) {
    this.#progress = progress;
    this.#now = now;
  }

  /** One progress report of the client. */
  update(p: { direction: "upload" | "download"; bytes: number; total: number }): void {
    if (!this.#progress.enabled || p.total < TRANSFER_LINE_BYTES) return;
    if (p.direction !== this.#direction) {
      this.#direction = p.direction;
      this.#started = this.#now();
    }
    const done = p.bytes >= p.total;
    this.active = !done;
    this.#progress.update(
      describeTransfer(p.direction, p.bytes, p.total, this.#now() - this.#started),
      { force: done },
    );
  }
}
