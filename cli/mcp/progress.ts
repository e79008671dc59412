/**
 * Progress notifications of one `kcoral mcp` tool call (`notifications/progress`): sent only
 * when the client's request carried `_meta.progressToken`. The current phase (`compiling on
 * http://...`, `running on http://...`) is repeated once a second with the time spent in it,
 * and large uploads and answers report their bytes, as `kcoral run` shows them on a terminal.
 * Each notification's `progress` is one more than the last, as MCP requires it to increase.
 *
 * @module
 */
import type { ServerNotification } from "@modelcontextprotocol/sdk/types.js";
import type { TransferProgress } from "../../client/mod.ts";
import { describeTransfer, formatElapsed, TRANSFER_LINE_BYTES } from "../run/progress.ts";

/** What {@linkcode ProgressReporter} needs of the SDK's request context. */
export interface ProgressTarget {
  /** The request's metadata; its `progressToken` turns reporting on. */
  _meta?: { progressToken?: string | number };
  /** Sends a notification tied to the request. */
  sendNotification: (notification: ServerNotification) => Promise<void>;
}

/** Options of {@linkcode ProgressReporter}. */
export interface ProgressReporterOptions {
  /** Time between the repeated phase messages, in milliseconds (default 1000). */
  intervalMs?: number;
  /** Clock in milliseconds (default `Date.now`). */
  now?: () => number;
}

/**
 * Progress notifications for one call; does nothing without a progress token.
 *
 * @example
 * ```ts
 * import { ProgressReporter } from "./progress.ts";
 *
 * const sent: string[] = [];
 * const reporter = new ProgressReporter({
 *   _meta: { progressToken: 7 },
 *   sendNotification: (n) => (sent.push(String(n.params?.message)), Promise.resolve()),
 * });
 * reporter.phase("running on http://127.0.0.1:8000");
 * reporter.transfer({ direction: "upload", bytes: 4 << 20, total: 8 << 20 });
 * reporter.stop();
 * if (sent[0] !== "running on http://127.0.0.1:8000, 0 s") throw new Error(sent[0]);
 * if (!sent[1].startsWith("uploading 4.0 MiB of 8.0 MiB (50%)")) throw new Error(sent[1]);
 * ```
 */
export class ProgressReporter {
  readonly #target: ProgressTarget;
  readonly #token: string | number | undefined;
  readonly #now: () => number;
  readonly #intervalMs: number;
  #count = 0;
  #phase = "";
  #phaseStarted = 0;
  #timer: ReturnType<typeof setInterval> | undefined;
  #transferStarted = 0;
  #direction: "upload" | "download" | null = null;
  #lastTransfer = -Infinity;
  #stopped = false;

  /** A reporter for the request described by `target`. */
  constructor(target: ProgressTarget, options: ProgressReporterOptions = {}) {
    this.#target = target;
    this.#token = target._meta?.progressToken;
    this.#now = options.now ?? Date.now;
    this.#intervalMs = options.intervalMs ?? 1000;
  }

  /** Whether the client asked for progress. */
  get enabled(): boolean {
    return this.#token !== undefined;
  }

  /** Start a phase: report it now, then every interval with the time spent in it. */
  phase(text: string): void {
    if (!this.enabled || this.#stopped) return;
    this.#phase = text;
    this.#phaseStarted = this.#now();
    this.#send(this.#phaseLine());
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.#send(this.#phaseLine()), this.#intervalMs);
    }
  }

  /** One report of the KCoral client's `onProgress`: bodies of 1 MiB or more are shown. */
  transfer(p: TransferProgress): void {
    if (!this.enabled || this.#stopped || p.total < TRANSFER_LINE_BYTES) return;
    const now = this.#now();
    if (p.direction !== this.#direction) {
      this.#direction = p.direction;
      this.#transferStarted = now;
    }
    const done = p.bytes >= p.total;
    if (!done && now - this.#lastTransfer < 250) return;
    this.#lastTransfer = now;
    const line = describeTransfer(p.direction, p.bytes, p.total, now - this.#transferStarted);
    this.#send(line.replace(/^kcoral: /, ""));
  }

  /** Stop reporting (the call has ended). */
  stop(): void {
    this.#stopped = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  #phaseLine(): string {
    return `${this.#phase}, ${formatElapsed(this.#now() - this.#phaseStarted)}`;
  }

  #send(message: string): void {
    if (this.#stopped || this.#token === undefined) return;
    this.#count += 1;
    this.#target.sendNotification({
      method: "notifications/progress",
      params: { progressToken: this.#token, progress: this.#count, message },
    }).catch(() => {
      // The client went away: nothing more to report.
      this.stop();
    });
  }
}
