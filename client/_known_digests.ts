/**
 * SHA-256 digests the client already knows for byte arrays, so that large bytes are not hashed
 * or copied again:
 *
 * - **returned**: every `bytes` value a response carried, with the digest it was verified
 *   against while decoding (computed while the body arrived, protocol/part_digests.ts). Valid
 *   while nobody changed the array: only code that holds the array from the response on (as
 *   `evaluateKernel` does with its bundles) may rely on it.
 * - **adopted**: arrays their holder promises never to change again, with their digest. An
 *   upload of an adopted array uses it as it is (no snapshot copy, no hash).
 *
 * ```
 * response --decode (verified digest)--> returned --holder adopts--> upload: no copy, no hash
 * ```
 *
 * @module
 */

const _returned = new WeakMap<Uint8Array, string>();
const _adopted = new WeakMap<Uint8Array, string>();

/**
 * Notes that `bytes` came back in a response and matched `sha256` there.
 *
 * @example
 * ```ts
 * import { noteReturned, returnedDigest } from "./_known_digests.ts";
 *
 * const bytes = new Uint8Array([1]);
 * noteReturned(bytes, "4bf5122f344554c53bde2ebb8cd2b7e3d1600ad631c385a5d7cce23c7785459a");
 * if (returnedDigest(bytes)?.length !== 64) throw new Error();
 * ```
 */
export function noteReturned(bytes: Uint8Array, sha256: string): void {
  _returned.set(bytes, sha256);
}

/** The digest `bytes` were verified against when a response returned them, if they were. */
export function returnedDigest(bytes: Uint8Array): string | undefined {
  return _returned.get(bytes);
}

/**
 * Hands `bytes` with their digest to uploads: the caller never changes them again, so an
 * upload uses them as they are instead of a copy, and `sha256` instead of hashing them.
 *
 * @example
 * ```ts
 * import { adoptBytes, adoptedDigest } from "./_known_digests.ts";
 *
 * const bytes = new Uint8Array([1]);
 * adoptBytes(bytes, "4bf5122f344554c53bde2ebb8cd2b7e3d1600ad631c385a5d7cce23c7785459a");
 * if (adoptedDigest(bytes) === undefined || adoptedDigest(new Uint8Array([1]))) throw new Error();
 * ```
 */
export function adoptBytes(bytes: Uint8Array, sha256: string): void {
  _adopted.set(bytes, sha256);
}

/** The digest of `bytes` if they were adopted (exactly this array), else `undefined`. */
export function adoptedDigest(bytes: Uint8Array): string | undefined {
  return _adopted.get(bytes);
}
