/**
 * The server's event log (spec server §8): one ordered JSON-lines stream per server start under
 * `<log-dir>/runs/<stamp>/events.jsonl`, program records under `programs/`, and a console mirror on
 * stderr. Hand-written: each server instance needs its own sinks, lines are written synchronously
 * in order, and both formats are fixed by upstream.
 *
 * @module
 */

/** Severity of an event. */
export type EventLevel = "DEBUG" | "INFO" | "WARNING" | "ERROR";

/** Options of an {@linkcode EventLog}. */
export interface EventLogOptions {
  /** Log directory; `null` writes no files. */
  logDir: string | null;
  /** Mirror events to stderr. */
  console: boolean;
  /** Record accepted programs. */
  programs: boolean;
  /** Where console lines go (default: stderr). */
  consoleWrite?: (line: string) => void;
  /**
   * `"text"` (default): `TIMESTAMP LEVEL event key=value ...`; `"json"`: one JSON object per line,
   * the record `events.jsonl` has, for log shippers.
   */
  consoleFormat?: LogFormat;
  /**
   * Events whose console lines are gathered into one stderr write, at most `consoleBatchMs` later;
   * any other line, `flush`, `close` and `unload` write them first (order is kept).
   */
  consoleBatched?: readonly string[];
  /** How long a gathered console line may wait (default 50 ms). */
  consoleBatchMs?: number;
}

/** How console lines are written: readable text or one JSON object per line. */
export type LogFormat = "text" | "json";

/**
 * A console message that is not an event (a listening line, a supervisor's message) in the
 * console's format: as it is for `"text"`, as `{"timestamp","level","event","message"}` for
 * `"json"`.
 */
export function consoleMessage(
  format: LogFormat,
  message: string,
  event: string,
  fields: Record<string, unknown> = {},
): string {
  if (format === "text") return message;
  return _jsonLine({
    timestamp: new Date().toISOString(),
    level: "INFO",
    event,
    ...fields,
    message,
  });
}

const _CONSOLE_SKIPPED = new Set(["traceback", "versions", "config", "ops", "uploads"]);
const _encoder = new TextEncoder();

/** An open event log. */
export class EventLog {
  /** The run directory of this server start, or `null` without log files. */
  readonly runDir: string | null;
  #file: Deno.FsFile | null = null;
  #console: ((lines: string[]) => void) | null;
  #programs: boolean;
  #json: boolean;
  #listeners = new Set<(record: Record<string, unknown>) => void>();
  readonly #batched: ReadonlySet<string>;
  readonly #batchMs: number;
  #pending: _PendingLine[] = [];
  #flushTimer: ReturnType<typeof setTimeout> | null = null;
  #onUnload: (() => void) | null = null;

  /** Opens the log, creating a fresh run directory when `logDir` is set. */
  constructor(options: EventLogOptions) {
    const write = options.consoleWrite;
    this.#console = !options.console
      ? null
      : write
      ? (lines) => lines.forEach((line) => write(line))
      : (lines) => Deno.stderr.writeSync(_encoder.encode(lines.join("\n") + "\n"));
    this.#programs = options.programs;
    this.#json = options.consoleFormat === "json";
    this.#batched = new Set(this.#console ? options.consoleBatched ?? [] : []);
    this.#batchMs = options.consoleBatchMs ?? 50;
    if (this.#batched.size > 0) {
      this.#onUnload = () => this.flush();
      globalThis.addEventListener("unload", this.#onUnload);
    }
    this.runDir = null;
    if (options.logDir) {
      try {
        this.runDir = _createRunDir(options.logDir);
        this.#file = Deno.openSync(`${this.runDir}/events.jsonl`, {
          create: true,
          append: true,
        });
        if (this.#programs) Deno.mkdirSync(`${this.runDir}/programs`, { recursive: true });
        // Upstream's capture-file folder: kept (empty) for tools that look for it.
        Deno.mkdirSync(`${this.runDir}/output`, { recursive: true });
      } catch (error) {
        this.#console?.([`kcoral: cannot open the event log in ${options.logDir}: ${error}`]);
        this.runDir = null;
        this.#file = null;
      }
    }
  }

  /** Writes one event (write errors are ignored, as upstream does). */
  emit(level: EventLevel, event: string, fields: Record<string, unknown> = {}): void {
    const timestamp = isoNow();
    const record: Record<string, unknown> = { timestamp, level, event, ...fields };
    for (const listener of this.#listeners) listener(record);
    if (this.#file) {
      try {
        this.#file.writeSync(_encoder.encode(_jsonLine(record) + "\n"));
      } catch {
        // best effort
      }
    }
    if (!this.#console) return;
    if (this.#batched.has(event)) {
      this.#pending.push({ record, level, event, fields });
      if (this.#flushTimer === null) {
        const timer = setTimeout(() => this.flush(), this.#batchMs);
        Deno.unrefTimer(timer);
        this.#flushTimer = timer;
      }
      return;
    }
    if (this.#pending.length > 0) this.flush();
    this.#write(this.#consoleText({ record, level, event, fields }));
  }

  /**
   * Writes the console lines gathered so far (those of {@linkcode EventLogOptions.consoleBatched}
   * events), in one write.
   */
  flush(): void {
    if (this.#flushTimer !== null) clearTimeout(this.#flushTimer);
    this.#flushTimer = null;
    if (this.#pending.length === 0) return;
    const lines = this.#pending;
    this.#pending = [];
    try {
      this.#console!(lines.map((line) => this.#consoleText(line)));
    } catch {
      // best effort
    }
  }

  #consoleText({ record, level, event, fields }: _PendingLine): string {
    if (this.#json) return _jsonLine(record);
    return _consoleLine(record.timestamp as string, level, event, fields);
  }

  #write(text: string): void {
    try {
      this.#console!([text]);
    } catch {
      // best effort
    }
  }

  /** Records the raw program JSON of an accepted request; returns its file name or `null`. */
  saveProgram(requestId: string, programText: Uint8Array): string | null {
    if (!this.runDir || !this.#programs) return null;
    const name = `${requestId}.json`;
    try {
      Deno.writeFileSync(`${this.runDir}/programs/${name}`, programText);
      return name;
    } catch {
      return null;
    }
  }

  /** Observes every event (used by tests and the bench); returns an unsubscribe function. */
  subscribe(listener: (record: Record<string, unknown>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Writes the gathered console lines and closes the log file. */
  close(): void {
    this.flush();
    if (this.#onUnload) globalThis.removeEventListener("unload", this.#onUnload);
    this.#onUnload = null;
    try {
      this.#file?.close();
    } catch {
      // already closed
    }
    this.#file = null;
  }
}

/** A console line not written yet: its record, and the fields as the event gave them. */
interface _PendingLine {
  record: Record<string, unknown>;
  level: EventLevel;
  event: string;
  fields: Record<string, unknown>;
}

function _createRunDir(logDir: string): string {
  const now = new Date();
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  const stamp = `${now.getUTCFullYear()}${pad(now.getUTCMonth() + 1)}${pad(now.getUTCDate())}T` +
    `${pad(now.getUTCHours())}${pad(now.getUTCMinutes())}${pad(now.getUTCSeconds())}.` +
    `${pad(now.getUTCMilliseconds(), 3)}000Z`;
  Deno.mkdirSync(`${logDir}/runs`, { recursive: true });
  for (let n = 0;; n++) {
    const dir = `${logDir}/runs/${stamp}${n === 0 ? "" : `-${n}`}`;
    try {
      Deno.mkdirSync(dir);
      return dir;
    } catch (error) {
      if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
    }
  }
}

function _jsonLine(record: Record<string, unknown>): string {
  try {
    return JSON.stringify(record, _replacer);
  } catch {
    const unencodable: Record<string, string> = {};
    for (const [key, value] of Object.entries(record)) {
      try {
        JSON.stringify(value, _replacer);
      } catch {
        unencodable[key] = String(value).slice(0, 2000);
      }
    }
    return JSON.stringify({
      timestamp: record.timestamp,
      level: record.level,
      event: record.event,
      unencodable_fields: unencodable,
    });
  }
}

function _replacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return Number(value);
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new TypeError("non-finite number in event");
  }
  if (value instanceof Map) return Object.fromEntries(value);
  if (value instanceof Set) return [...value];
  return value;
}

function _consoleLine(
  timestamp: string,
  level: EventLevel,
  event: string,
  fields: Record<string, unknown>,
): string {
  const parts = [`${timestamp} ${level.padEnd(7)} ${event}`];
  for (const [key, value] of Object.entries(fields)) {
    if (value === null || value === undefined || _CONSOLE_SKIPPED.has(key)) continue;
    let text: string;
    if (typeof value === "number") {
      text = Number.isInteger(value) ? String(value) : value.toFixed(1);
    } else if (typeof value === "string") {
      text = value;
    } else {
      try {
        text = JSON.stringify(value, _replacer);
      } catch {
        text = String(value);
      }
    }
    if (text.length > 120) text = text.slice(0, 120) + "...";
    parts.push(`${key}=${text}`);
  }
  return parts.join(" ");
}

let _isoMs = Number.NaN;
let _isoText = "";
let _dayStartMs = Number.NaN;
let _dayPrefix = "";

/** `new Date().toISOString()`, cheaper: the date formatted once a day, the last ms's text reused. */

export function isoNow(): string {
  const ms = Date.now();
  if (ms === _isoMs) return _isoText;
  const dayStart = Math.floor(ms / 86_400_000) * 86_400_000;
  if (dayStart !== _dayStartMs) {
    _dayStartMs = dayStart;
    _dayPrefix = new Date(dayStart).toISOString().slice(0, -13); // up to and with the "T"
  }
  let rest = ms - dayStart;
  const milli = rest % 1000;
  rest = (rest - milli) / 1000;
  const second = rest % 60;
  rest = (rest - second) / 60;
  const minute = rest % 60;
  const hour = (rest - minute) / 60;
  _isoMs = ms;
  _isoText = `${_dayPrefix}${_two(hour)}:${_two(minute)}:${_two(second)}.${
    milli < 10 ? "00" : milli < 100 ? "0" : ""
  }${milli}Z`;
  return _isoText;
}

function _two(n: number): string {
  return n < 10 ? `0${n}` : `${n}`;
}
