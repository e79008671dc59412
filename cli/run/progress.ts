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
    if (!this.#enabled) return;
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
