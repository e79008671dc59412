/**
 * Noticing a client that went away while its request is on a node (spec router §2.2 item 11,
 * §3): the attempt then gives its slot up at once (`cancel client_disconnected`) instead of when
 * the node answers.
 *
 * ```
 *  watch(request, onGone) ─▶ waiting (a Set entry: nothing else per request)
 *  every `afterMs` (one timer for all) ─▶ requests waiting longer ─▶ request.signal watched
 *  the client's connection closes ─▶ its signal aborts ─▶ onGone()
 *  unwatch() (answered, streaming, failed) ─▶ forgotten
 * ```
 *
 * The Router's connections are its own (http/http1_server.ts): once a request's body has
 * arrived a read stays pending on its connection, and the connection's end aborts the request's
 * `signal`, whatever the body's size; a body still arriving fails instead. Listening on a signal
 * costs a request about 2 µs, where most requests are answered within a millisecond; so a
 * request is watched only once it has waited `afterMs`: a client that goes away is noticed
 * within about twice that, and a request answered sooner costs a `Set` entry.
 *
 * @module
 */
/** A request being watched: when it came, and what to call once its client has gone. */
interface _Watched {
  since: number;
  request: Request;
  onGone: () => void;
  signal: AbortSignal | null;
}

/** Watches requests' clients, one timer for all. */
export class ClientWatch {
  readonly #afterMs: number;
  readonly #now: () => number;
  /** Requests not watched yet, oldest first (a `Set` keeps insertion order). */
  readonly #waiting = new Set<_Watched>();
  #timer: ReturnType<typeof setInterval> | null = null;

  /**
   * A watch that looks at requests older than `afterMs` (default 250) every `afterMs`; not
   * running until {@linkcode ClientWatch.start}.
   */
  constructor(afterMs = 250, now: () => number = () => performance.now()) {
    this.#afterMs = afterMs;
    this.#now = now;
  }

  /** Starts the timer (it does not keep the process alive). Idempotent. */
  start(): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => this.check(), this.#afterMs);
    Deno.unrefTimer(this.#timer);
  }

  /**
   * Stops the timer; requests already watched through their signal stay watched until
   * unwatched. Idempotent.
   */
  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  /**
   * Watches `request`'s client: `onGone` runs (once) if it goes away before the returned
   * function is called.
   */
  watch(request: Request, onGone: () => void): () => void {
    const watched: _Watched = { since: this.#now(), request, onGone, signal: null };
    this.#waiting.add(watched);
    return () => {
      if (!this.#waiting.delete(watched)) watched.signal?.removeEventListener("abort", onGone);
    };
  }

  /**
   * Watches the signals of the requests that have waited at least `afterMs` (the timer's
   * work; callable directly).
   */
  check(): void {
    const due = this.#now() - this.#afterMs;
    for (const watched of this.#waiting) {
      if (watched.since > due) break;
      this.#waiting.delete(watched);
      const signal = watched.request.signal;
      if (signal.aborted) {
        watched.onGone();
        continue;
      }
      watched.signal = signal;
      signal.addEventListener("abort", watched.onGone, { once: true });
    }
  }

  /** Requests not yet watched through their signal. */
  get waiting(): number {
    return this.#waiting.size;
  }
}
