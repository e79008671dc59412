/**
 * Blob resolution and the CACHE_MISS negotiation: supplied parts are offered to the caches, every
 * referenced hash is resolved from the request, the disk cache (file uploads) or the memory cache
 * (tensor, bytes, library uploads), and what remains is reported missing. Resolved blobs stay
 * pinned until the request releases them.
 *
 * @module
 */
import type { ParsedProgram } from "../../protocol/program_types.ts";
import { tensorLengthError, unreferencedBlobsError } from "../../protocol/request.ts";
import type { BlobStore } from "./cache_memory.ts";
import type { DiskFileCache } from "./cache_disk.ts";

/** A request whose blobs are inconsistent (HTTP 400, kind `parse`). */
export class BlobRejected extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "BlobRejected";
  }
}

/** The outcome of resolving a program's blobs. */
export type BlobResolution =
  | { kind: "missing"; missing: string[] }
  | {
    kind: "ready";
    /** SHA-256 → path of the file holding the bytes. */
    paths: Record<string, string>;
    /** Total bytes of all resolved blobs. */
    bytes: number;
    /** Supplied blobs whose files were spooled while the request arrived and renamed into place. */
    spooled: number;
    /** Unpins every blob (call once, when the request is done with them). */
    release: () => void;
  };

/** The caches a server resolves blobs against. */
export interface BlobCaches {
  /** Memory cache (a directory of blob files). */
  store: BlobStore;
  /** Disk cache for file uploads. */
  disk: DiskFileCache;
  /** Pending disk writes are registered here so shutdown can wait for them. */
  track?: (write: Promise<void>) => void;
  /** A file in the memory cache's directory already holding these supplied bytes, to take over. */
  spooled?: (bytes: Uint8Array) => string | undefined;
}

/**
 * Resolves the blobs of `program` given the `supplied` parts. Throws {@linkcode BlobRejected} for
 * unreferenced parts or a tensor length mismatch (which wins over missing blobs).
 */
export async function resolveBlobs(
  program: ParsedProgram,
  supplied: Map<string, Uint8Array>,
  caches: BlobCaches,
): Promise<BlobResolution> {
  const { store, disk } = caches;
  const unreferenced = unreferencedBlobsError(program, supplied.keys());
  if (unreferenced !== undefined) throw new BlobRejected(unreferenced);

  const pinned: string[] = [];
  const release = () => {
    store.unpin(pinned);
    pinned.length = 0;
  };
  const sizes = new Map<string, number>();
  const missing: string[] = [];
  const diskWrites: [string, Uint8Array][] = [];
  let spooled = 0;
  try {
    const writes: Promise<void>[] = [];
    for (const ref of program.blobs) {
      const bytes = supplied.get(ref.sha256);
      if (!bytes) continue;
      const otherUse = _otherUse(ref);
      pinned.push(ref.sha256);
      sizes.set(ref.sha256, bytes.length);
      const spoolFile = caches.spooled?.(bytes);
      writes.push(
        spoolFile === undefined
          ? store.putPinned(ref.sha256, bytes, otherUse)
          : store.adoptPinned(ref.sha256, spoolFile, bytes.length, otherUse).then(
            (renamed) => void (renamed && spooled++),
            async () => {
              // Not taken over: the bytes are written anew, the file goes.
              await Deno.remove(spoolFile).catch(() => {});
              await store.putPinned(ref.sha256, bytes, otherUse);
            },
          ),
      );
      if (ref.uses.has("file") && disk.enabled) diskWrites.push([ref.sha256, bytes]);
    }
    const settled = await Promise.allSettled(writes);
    const failed = settled.find((r) => r.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    for (const ref of program.blobs) {
      const sha = ref.sha256;
      const fileUse = ref.uses.has("file");
      const otherUse = _otherUse(ref);
      if (supplied.has(sha)) continue;
      if (fileUse && disk.enabled) {
        const cached = await disk.get(sha);
        if (cached) {
          disk.counters.hits++;
          await store.putPinned(sha, cached, false);
          pinned.push(sha);
          sizes.set(sha, cached.length);
          continue;
        }
        disk.counters.misses++;
      }
      if (otherUse && store.has(sha) && store.pinExisting([sha])) {
        store.counters.hits++;
        pinned.push(sha);
        await store.written([sha]);
        sizes.set(sha, (await Deno.stat(store.path(sha))).size);
        continue;
      }
      if (otherUse) store.counters.misses++;
      missing.push(sha);
    }
    if (diskWrites.length > 0) {
      const write = disk.putBatch(diskWrites);
      caches.track?.(write);
    }
    // Before CACHE_MISS, in upstream's wording.
    const wrongLength = tensorLengthError(program, (sha) => sizes.get(sha));
    if (wrongLength !== undefined) throw new BlobRejected(wrongLength);
  } catch (error) {
    release();
    throw error;
  }
  if (missing.length > 0) {
    release();
    return { kind: "missing", missing };
  }
  const paths: Record<string, string> = {};
  let total = 0;
  for (const [sha, size] of sizes) {
    paths[sha] = store.path(sha);
    total += size;
  }
  let released = false;
  return {
    kind: "ready",
    paths,
    bytes: total,
    spooled,
    release: () => {
      if (!released) {
        released = true;
        release();
      }
    },
  };
}

function _otherUse(ref: ParsedProgram["blobs"][number]): boolean {
  return ref.uses.has("tensor") || ref.uses.has("bytes") || ref.uses.has("library");
}
