/**
 * A multipart boundary per program that occurs in none of its blobs, kept up to date as blobs
 * are added: each blob is scanned once, when it joins the program (next to its hash), instead of
 * on every send. A resend of two 64 MiB blobs otherwise scans 128 MiB between the CACHE_MISS
 * answer and the first byte sent (~10 ms on the H200 host).
 *
 * Adopted blobs (client/_known_digests.ts: results a client passes on, often to a server that
 * already has them) join unscanned: the boundary is checked against one only when a request
 * carries it.
 *
 * @module
 */

import { boundaryOccursIn, newBoundary } from "../protocol/multipart_encode.ts";

const _boundaries = new WeakMap<object, string>();
const _unscanned = new WeakMap<object, Set<Uint8Array>>();

/** Notes that `added` joined `owner`'s blobs; `all` is every blob it now holds. */
export function noteBlobs(
  owner: object,
  all: Iterable<Uint8Array>,
  added: readonly Uint8Array[],
): void {
  let boundary = _boundaries.get(owner) ?? newBoundary();
  if (added.some((bytes) => boundaryOccursIn(bytes, boundary))) {
    const blobs = [...all];
    do boundary = newBoundary(); while (blobs.some((bytes) => boundaryOccursIn(bytes, boundary)));
  }
  _boundaries.set(owner, boundary);
}

/** A boundary that occurs in none of the blobs noted for `owner` (undefined before any). */
export function blobBoundary(owner: object): string | undefined {
  return _boundaries.get(owner);
}

/** Notes that `bytes` joined `owner`'s blobs without a scan (checked when a request sends it). */
export function noteUnscanned(owner: object, bytes: Uint8Array): void {
  let set = _unscanned.get(owner);
  if (set === undefined) _unscanned.set(owner, set = new Set());
  set.add(bytes);
}

/** The blobs of `owner` that its boundary was never checked against. */
export function unscannedBlobs(owner: object): ReadonlySet<Uint8Array> {
  return _unscanned.get(owner) ?? new Set();
}
