/**
 * Which node takes a request (spec router §2.3): the client's preferred node when it is a
 * candidate, otherwise the less loaded of two distinct candidates drawn at random ("power of two
 * choices"), ties going to the one selected least recently. Load is normalised,
 * `max(in_flight, busy_workers) / max(worker_count, 1)`, and compared by cross-multiplication, so
 * no floating point is involved. Pure functions over {@linkcode LoadView}s.
 *
 * @module
 */

/** What selection reads of a candidate node. */
export interface LoadView {
  /** The node's name. */
  readonly name: string;
  /** Requests the Router has running on the node now. */
  readonly inFlight: number;
  /** Busy workers in the node's latest healthy report. */
  readonly busyWorkers: number;
  /** Workers in the node's latest healthy report. */
  readonly workerCount: number;
  /** The Router's selection sequence number when the node was last chosen (0: never). */
  readonly lastSelected: number;
}

/**
 * The work a node is estimated to have: `max(in_flight, busy_workers)`, since a slot the Router
 * discarded may still be computing on the node.
 */
export function estimatedUsed(node: LoadView): number {
  return Math.max(node.inFlight, node.busyWorkers);
}

/**
 * Compares the normalised loads of two nodes: negative when `first` is less loaded, positive
 * when more, 0 when equal. Exact (integers, cross-multiplied as `bigint`).
 */
export function compareLoad(first: LoadView, second: LoadView): number {
  const left = BigInt(estimatedUsed(first)) * BigInt(Math.max(second.workerCount, 1));
  const right = BigInt(estimatedUsed(second)) * BigInt(Math.max(first.workerCount, 1));
  return left < right ? -1 : left > right ? 1 : 0;
}

/**
 * Power of two choices: one candidate is taken; otherwise two distinct ones are drawn uniformly
 * with `random` (values in `[0, 1)`), and the lower load wins; on equal load the one with the
 * smaller `lastSelected` (least recently selected); if still equal, the first drawn. Throws a
 * `RangeError` for no candidates.
 */
export function choosePowerOfTwo<T extends LoadView>(
  candidates: readonly T[],
  random: () => number = Math.random,
): T {
  const count = candidates.length;
  if (count === 0) throw new RangeError("no candidates to choose from");
  if (count === 1) return candidates[0];
  const firstPosition = drawIndex(random, count);
  const secondPosition = (firstPosition + 1 + drawIndex(random, count - 1)) % count;
  const first = candidates[firstPosition];
  const second = candidates[secondPosition];
  const order = compareLoad(first, second) || first.lastSelected - second.lastSelected;
  return order > 0 ? second : first;
}

/**
 * The node for a request: the candidate named `preferred` (the `x-kcoral-node` header) when
 * there is one, otherwise {@linkcode choosePowerOfTwo}; `null` when there are no candidates (the
 * Router never waits for the preferred node specifically).
 */
export function selectNode<T extends LoadView>(
  candidates: readonly T[],
  preferred: string | null,
  random: () => number = Math.random,
): T | null {
  if (candidates.length === 0) return null;
  if (preferred !== null) {
    const named = candidates.find((node) => node.name === preferred);
    if (named !== undefined) return named;
  }
  return choosePowerOfTwo(candidates, random);
}

/** A uniform index in `[0, count)` from `random`, clamped against values outside `[0, 1)`. */
function drawIndex(random: () => number, count: number): number {
  const index = Math.floor(random() * count);
  return Number.isFinite(index) ? Math.min(Math.max(index, 0), count - 1) : 0;
}
