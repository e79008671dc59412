/**
 * Work an application leaves running after a request has been answered (cache writes, a finished
 * workspace's removal, a GPU set's teardown): tracked so that a stop waits for it, and so that its
 * failure never becomes an unhandled rejection.
 *
 * @module
 */

/** A set of background tasks. */
export class Background {
  readonly #tasks = new Set<Promise<void>>();

  /** Tracks `task` until it settles (its failure is dropped). */
  track(task: Promise<unknown>): void {
    const tracked = task.then(() => {}, () => {});
    this.#tasks.add(tracked);
    tracked.finally(() => this.#tasks.delete(tracked));
  }

  /** Resolves once every task tracked so far, and any they started meanwhile, has settled. */
  async settled(): Promise<void> {
    while (this.#tasks.size > 0) await Promise.allSettled([...this.#tasks]);
  }
}
