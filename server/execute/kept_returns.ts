/**
 * Kept returns (docs/kept-returns.md): values a worker wrote for the blob cache instead of the
 * answer are copied into the memory cache under the SHA-256 the server computes while copying
 * (the worker may still hold its file open, so the copy is what is served). The worker does not
 * hash them: each `kept` node of its results JSON names a placeholder, and the server writes its
 * digest over it ({@linkcode fillKeptDigests}). A placeholder that is malformed, missing or not
 * alone, too many bytes or values not asked for are the worker's fault
 * ({@linkcode WorkerFileError}).
 *
 * @module
 */
import type { BlobStore } from "../cache/cache_memory.ts";
import { type FileCopier, FileSourceError } from "../../protocol/hash_threads.ts";
import type { OutcomeKept } from "../workers/worker_protocol.ts";
import { openWorkerFile, WorkerFileError } from "../workers/worker_files.ts";

/** What a request allows to be kept: the cache, and the most bytes its kept values may total. */
export interface KeepTarget {
  /** The memory cache the values go to. */
  store: BlobStore;
  /** The most bytes the request's kept values may total. */
  maxBytes: number;
  /** Hashing threads: each copies and hashes a value, several values at once. */
  hashes: FileCopier;
}

/** Values copied at once when hashing threads hash them. */
const _AT_ONCE = 8;

/** A worker's placeholder for a kept value's digest (runtime_py `values.KeptPart`). */
const _PLACEHOLDER = /^kcoral-kept-[0-9a-f]{32}$/;

/**
 * Puts every kept value of an answer into `target`'s cache (retained, not pinned) under the
 * SHA-256 computed while copying it; resolves with the digests, in order, once all are in (a
 * program sent after the answer finds them).
 *
 * @example
 * ```ts ignore
 * const digests = await keepReturns(outcome.kept ?? [], { store, maxBytes });
 * const results = fillKeptDigests(outcome.results ?? "{}", outcome.kept ?? [], digests);
 * ```
 */
export async function keepReturns(
  kept: readonly OutcomeKept[],
  target: KeepTarget | null,
): Promise<string[]> {
  if (kept.length === 0) return [];
  if (target === null) throw new WorkerFileError("worker kept returns the request did not ask for");
  const total = kept.reduce((sum, part) => sum + part.size, 0);
  if (total > target.maxBytes) {
    throw new WorkerFileError(
      `worker kept ${total} bytes of returns, over the request's ${target.maxBytes}`,
    );
  }
  for (const part of kept) {
    if (typeof part.placeholder !== "string" || !_PLACEHOLDER.test(part.placeholder)) {
      throw new WorkerFileError(`worker kept return ${part.path} has a malformed placeholder`);
    }
  }
  const digests: string[] = new Array(kept.length);
  let next = 0;
  const copier = async () => {
    for (let i = next++; i < kept.length; i = next++) {
      digests[i] = await _keep(kept[i], target.store, target.hashes);
    }
  };
  const copiers = Math.min(_AT_ONCE, kept.length);
  // Every copier runs to its end (a failure leaves no copy running), then the first error.
  const ended = await Promise.allSettled(Array.from({ length: copiers }, copier));
  for (const end of ended) if (end.status === "rejected") throw end.reason;
  return digests;
}

/**
 * The results JSON with each kept value's placeholder replaced by its digest. Each placeholder
 * must occur exactly once, as a JSON string (the `sha256` of its `kept` node).
 *
 * @example
 * ```ts
 * import { fillKeptDigests } from "./kept_returns.ts";
 *
 * const placeholder = "kcoral-kept-" + "0".repeat(32);
 * const results = `{"r":{"type":"kept","kind":"bytes","sha256":"${placeholder}","size":4}}`;
 * const filled = fillKeptDigests(results, [{ path: "kept-0", size: 4, placeholder }], ["ab".repeat(32)]);
 * console.assert(filled.includes(`"sha256":"${"ab".repeat(32)}"`));
 * ```
 */
export function fillKeptDigests(
  results: string,
  kept: readonly OutcomeKept[],
  digests: readonly string[],
): string {
  let filled = results;
  for (const [i, part] of kept.entries()) {
    const quoted = `"${part.placeholder}"`;
    const at = filled.indexOf(quoted);
    if (at < 0 || filled.indexOf(quoted, at + 1) >= 0) {
      throw new WorkerFileError(
        `worker results name kept return ${part.path}'s placeholder ${
          at < 0 ? "nowhere" : "twice"
        }`,
      );
    }
    filled = filled.slice(0, at) + `"${digests[i]}"` + filled.slice(at + quoted.length);
  }
  return filled;
}

async function _keep(
  part: OutcomeKept,
  store: BlobStore,
  hashes: FileCopier,
): Promise<string> {
  const tmp = `${store.dir}/.kept-${crypto.randomUUID()}`;
  const source = await openWorkerFile(part.path, part.size);
  let copied = false;
  try {
    // The thread opens the path again: the same file, checked there by its inode.
    const { ino, dev } = await source.stat();
    const digest = await hashes.copyHashing(part.path, tmp, part.size, { ino, dev }).catch(
      (error) => {
        // The worker's file changing under the copy is its fault; anything else is the server's.
        if (!(error instanceof FileSourceError)) throw error;
        throw new WorkerFileError(`worker kept return ${error.message}`);
      },
    );
    await store.adoptPinned(digest, tmp, part.size, true);
    copied = true;
    store.unpin([digest]);
    return digest;
  } finally {
    source.close();
    if (!copied) await Deno.remove(tmp).catch(() => {});
  }
}
