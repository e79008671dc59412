/**
 * The memory cache for tensor, bytes and library blobs (spec server §6.2), kept as
 * content-addressed files in a RAM-backed directory so workers read them without the bytes
 * crossing a pipe. LRU by use; objects larger than a quarter of the capacity are not kept
 * (they still serve the request that brought them); entries in use by a request are pinned.
 *
 * @module
 */
import { writeNewFile } from "./_write_file.ts";
import { CacheCounters } from "./cache_counters.ts";

/** Blobs up to this size are written without leaving the event loop. */
const _SYNC_WRITE_BYTES = 64 * 1024;
/**
 * Blob files up to this size are unlinked without leaving the event loop. A larger one is moved
 * aside and unlinked on the thread pool: freeing a tmpfs file's pages takes the unlink ~0.12–0.15
 * ms per MiB (64 MiB: 8–10 ms, 256 MiB: 30–40 ms; bench/probes/tmpfs_unlink.ts), a stall for every
 * request the server holds.
 */
const _SYNC_UNLINK_BYTES = 64 * 1024;

interface _Entry {
  size: number;
  pins: number;
  /** Kept after its requests end (LRU member); transient entries go when unpinned. */
  retained: boolean;
}

/** A directory of content-addressed blob files with LRU retention and pinning. */
export class BlobStore {
  /** The directory holding one file per blob, named by its SHA-256. */
  readonly dir: string;
  /** Retention capacity in bytes. */
  readonly capacityBytes: number;
  /** Hits, misses (counted by the blob resolution) and evictions. */
  readonly counters: CacheCounters = new CacheCounters();
  #entries = new Map<string, _Entry>(); // insertion order = LRU order (first = least recent)
  #retainedBytes = 0;
  #writes = new Map<string, Promise<void>>();
  #unlinks = new Set<Promise<void>>();

  #unlinkLarge: (path: string) => Promise<void>;

  /**
   * Uses `dir` (created if missing; existing blob files are discarded). `unlinkLarge` unlinks a
   * dropped blob's file that is too large to unlink on the event loop (after it was moved aside).
   */
  constructor(
    dir: string,
    capacityBytes: number,
    unlinkLarge: (path: string) => Promise<void> = (path) => Deno.remove(path),
  ) {
    this.dir = dir;
    this.capacityBytes = capacityBytes;
    this.#unlinkLarge = unlinkLarge;
    Deno.mkdirSync(dir, { recursive: true, mode: 0o755 });
  }

  /** Bytes currently retained by the LRU. */
  get retainedBytes(): number {
    return this.#retainedBytes;
  }

  /** The file that holds (or will hold) blob `sha256`. */
  path(sha256: string): string {
    return `${this.dir}/${sha256}`;
  }

  /** Whether the blob is present (retained or in use); a hit moves it to most recent. */
  has(sha256: string): boolean {
    const entry = this.#entries.get(sha256);
    if (!entry) return false;
    this.#entries.delete(sha256);
    this.#entries.set(sha256, entry);
    return true;
  }

  /**
   * Stores a blob and pins it once (release with {@linkcode unpin}). `retain` offers it to
   * the LRU; objects over a quarter of the capacity are kept only while pinned.
   */
  async putPinned(sha256: string, bytes: Uint8Array, retain: boolean): Promise<void> {
    await this.#put(sha256, bytes.length, retain, () => this.#write(sha256, bytes), null);
  }

  /**
   * Like {@linkcode putPinned} for bytes already in the file `path` (in this directory, e.g. one
   * written while the request arrived): the file is renamed into place (resolves `true`), or
   * deleted when the blob is already stored (`false`). On failure nothing is stored and the
   * file is left to the caller.
   */
  async adoptPinned(sha256: string, path: string, size: number, retain: boolean): Promise<boolean> {
    let renamed = false;
    await this.#put(
      sha256,
      size,
      retain,
      async () => {
        await Deno.rename(path, this.path(sha256));
        renamed = true;
      },
      () => Deno.remove(path).catch(() => {}),
    );
    return renamed;
  }

  async #put(
    sha256: string,
    size: number,
    retain: boolean,
    write: () => Promise<void>,
    discard: (() => Promise<void>) | null,
  ): Promise<void> {
    const keep = retain && size <= this.capacityBytes / 4;
    let entry = this.#entries.get(sha256);
    if (entry) {
      entry.pins++;
      if (keep && !entry.retained) {
        entry.retained = true;
        this.#retainedBytes += entry.size;
      }
      this.#entries.delete(sha256);
      this.#entries.set(sha256, entry);
      await discard?.();
      await this.#writes.get(sha256);
    } else {
      entry = { size, pins: 1, retained: keep };
      this.#entries.set(sha256, entry);
      if (keep) this.#retainedBytes += entry.size;
      const written = write();
      this.#writes.set(sha256, written);
      try {
        await written;
      } catch (error) {
        this.#drop(sha256);
        throw error;
      } finally {
        this.#writes.delete(sha256);
      }
    }
    this.#evict();
  }

  /** Pins blobs already present; returns false (pinning nothing) if any is missing. */
  pinExisting(hashes: Iterable<string>): boolean {
    const list = [...hashes];
    if (!list.every((sha) => this.#entries.has(sha))) return false;
    for (const sha of list) this.#entries.get(sha)!.pins++;
    return true;
  }

  /** Resolves once every given blob's file is completely written. */
  async written(hashes: Iterable<string>): Promise<void> {
    for (const sha of hashes) await this.#writes.get(sha);
  }

  /** Releases one pin of each blob; transient blobs are deleted when no request uses them. */
  unpin(hashes: Iterable<string>): void {
    for (const sha of hashes) {
      const entry = this.#entries.get(sha);
      if (!entry) continue;
      entry.pins = Math.max(0, entry.pins - 1);
      if (entry.pins === 0 && !entry.retained) this.#drop(sha);
    }
    this.#evict();
  }

  /**
   * Resolves once the files of blobs dropped so far are unlinked (large ones go on the thread
   * pool, after the blob is already gone from the store).
   */
  async unlinked(): Promise<void> {
    while (this.#unlinks.size > 0) await Promise.all(this.#unlinks);
  }

  /** Deletes every blob file and the directory. */
  close(): void {
    this.#entries.clear();
    this.#retainedBytes = 0;
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // already gone
    }
  }

  async #write(sha256: string, bytes: Uint8Array): Promise<void> {
    const tmp = `${this.dir}/.tmp-${crypto.randomUUID()}`;
    if (bytes.length <= _SYNC_WRITE_BYTES) {
      // A small file costs more in thread-pool round trips than in copying: programs with
      // thousands of small blobs store them ~5x faster this way (tmpfs, page cache).
      Deno.writeFileSync(tmp, bytes, { createNew: true, mode: 0o644 });
      Deno.renameSync(tmp, this.path(sha256));
      return;
    }
    await writeNewFile(tmp, bytes, 0o644);
    await Deno.rename(tmp, this.path(sha256));
  }

  #evict(): void {
    if (this.#retainedBytes <= this.capacityBytes) return;
    for (const [sha, entry] of this.#entries) {
      if (this.#retainedBytes <= this.capacityBytes) break;
      if (!entry.retained || entry.pins > 0) continue;
      this.#drop(sha);
      this.counters.evictions++;
    }
  }

  #drop(sha256: string): void {
    const entry = this.#entries.get(sha256);
    if (!entry) return;
    this.#entries.delete(sha256);
    if (entry.retained) this.#retainedBytes -= entry.size;
    const path = this.path(sha256);
    try {
      if (entry.size <= _SYNC_UNLINK_BYTES) {
        Deno.removeSync(path);
        return;
      }
      // Out of the blob's name at once (a request storing the same blob again writes a new
      // file there), then unlinked off the event loop.
      const aside = `${this.dir}/.dropped-${crypto.randomUUID()}`;
      Deno.renameSync(path, aside);
      const unlink = this.#unlinkLarge(aside).catch(() => {}).finally(() =>
        this.#unlinks.delete(unlink)
      );
      this.#unlinks.add(unlink);
    } catch {
      // never written or already gone
    }
  }
}
