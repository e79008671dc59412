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
 * Reading a `Deno.serve` request's `signal` and listening on it costs each request a few
 * microseconds, and a timer of its own would cost more (decisions.md, "The Router finishes an
 * attempt without a timer"); most requests are answered in a millisecond. So a request is
 * watched only once it has waited `afterMs`: a client that goes away is noticed within about
 * twice that, and a request answered sooner costs a `Set` entry.
 *
 * `Deno.serve` aborts the signal only for requests of up to 512 bytes
 * (bench/probes/client_gone_signal.ts). So a watched request whose client port is known is also
 * looked up, once per tick for all of them, among the connections the kernel still has
 * established to the Router's port (http/tcp_peers.ts): one that closed or reset is gone.
 *
 * @module
 */
import { establishedPeerPorts } from "../http/tcp_peers.ts";

/** A request being watched: when it came, and what to call once its client has gone. */
interface _Watched {
  since: number;
  request: Request;
  onGone: () => void;
  signal: AbortSignal | null;
  /** The client's port on its connection to the Router (`null`: not known). */
  clientPort: number | null;
}

/** Watches requests' clients, one timer for all. */
export class ClientWatch {
  readonly #afterMs: number;
  readonly #now: () => number;
  /** Requests not watched yet, oldest first (a `Set` keeps insertion order). */
  readonly #waiting = new Set<_Watched>();
  /** Requests watched through the kernel's connections too. */
  readonly #byPort = new Set<_Watched>();
  #localPort: number | null = null;
  #timer: ReturnType<typeof setInterval> | null = null;

  /**
   * A watch that looks at requests older than `afterMs` (default 250) every `afterMs`; not
   * running until {@linkcode ClientWatch.start}.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * const watch = new ClientWatch(100);
   * watch.start();
   * watch.stop();
   * ```
   */
  constructor(afterMs = 250, now: () => number = () => performance.now()) {
    this.#afterMs = afterMs;
    this.#now = now;
  }

  /**
   * Starts the timer (it does not keep the process alive). Idempotent.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * const watch = new ClientWatch();
   * watch.start();
   * watch.start();
   * watch.stop();
   * ```
   */
  start(): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => this.check(), this.#afterMs);
    Deno.unrefTimer(this.#timer);
  }

  /**
   * Stops the timer; requests already watched through their signal stay watched until
   * unwatched. Idempotent.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * new ClientWatch().stop();
   * ```
   */
  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  /**
   * Watches `request`'s client: `onGone` runs (once) if it goes away before the returned
   * function is called.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * let clock = 0;
   * const watch = new ClientWatch(250, () => clock);
   * const controller = new AbortController();
   * const request = new Request("http://router/execute", { signal: controller.signal });
   * let gone = false;
   * const unwatch = watch.watch(request, () => (gone = true));
   * clock = 300;
   * watch.check();
   * controller.abort();
   * if (!gone) throw new Error("not noticed");
   * unwatch();
   * ```
   */
  watch(request: Request, onGone: () => void, clientPort: number | null = null): () => void {
    const watched: _Watched = { since: this.#now(), request, onGone, signal: null, clientPort };
    this.#waiting.add(watched);
    return () => {
      this.#byPort.delete(watched);
      if (!this.#waiting.delete(watched)) watched.signal?.removeEventListener("abort", onGone);
    };
  }

  /**
   * The port the Router listens on: watched requests with a client port are then looked up
   * among its established connections.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * let clock = 0;
   * const watch = new ClientWatch(250, () => clock);
   * watch.listening(9); // nothing connects to port 9 here: every client there has gone
   * let gone = false;
   * watch.watch(new Request("http://router/execute"), () => (gone = true), 40000);
   * clock = 300;
   * watch.check();
   * if (Deno.build.os === "linux" && !gone) throw new Error("not noticed");
   * ```
   */
  listening(port: number): void {
    this.#localPort = port;
  }

  /**
   * Whether the client on `clientPort` still has its connection established, now (one look at
   * the kernel's table); `null` when that cannot be told (no port, not Linux).
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * const watch = new ClientWatch();
   * if (watch.present(40000) !== null) throw new Error("no port to look at yet");
   * ```
   */
  present(clientPort: number | null): boolean | null {
    if (clientPort === null || this.#localPort === null) return null;
    return establishedPeerPorts(this.#localPort)?.has(clientPort) ?? null;
  }

  /**
   * Watches the signals of the requests that have waited at least `afterMs` (the timer's
   * work; callable directly).
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * new ClientWatch().check(); // nothing waiting: nothing to do
   * ```
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
      if (watched.clientPort !== null && this.#localPort !== null) this.#byPort.add(watched);
    }
    if (this.#byPort.size === 0) return;
    const present = establishedPeerPorts(this.#localPort!);
    if (present === null) return;
    for (const watched of this.#byPort) {
      if (present.has(watched.clientPort!)) continue;
      this.#byPort.delete(watched);
      watched.signal?.removeEventListener("abort", watched.onGone);
      watched.onGone();
    }
  }

  /**
   * Requests not yet watched through their signal.
   *
   * @example
   * ```ts
   * import { ClientWatch } from "./client_watch.ts";
   *
   * const watch = new ClientWatch();
   * const unwatch = watch.watch(new Request("http://router/execute"), () => {});
   * const before = watch.waiting;
   * unwatch();
   * if (before !== 1 || watch.waiting !== 0) throw new Error();
   * ```
   */
  get waiting(): number {
    return this.#waiting.size;
  }
}
