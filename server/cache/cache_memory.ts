/**
 * The memory cache for tensor, bytes and library blobs: content-addressed files in a RAM-backed
 * directory, so workers read them without the bytes crossing a pipe. LRU by use; objects over a
 * quarter of the capacity are not kept; entries in use by a request are pinned.
 *
 * @module
 */
import { writeNewFile } from "./_write_file.ts";
import { CacheCounters } from "./cache_counters.ts";

/** Blobs up to this size are written without leaving the event loop. */
const _SYNC_WRITE_BYTES = 64 * 1024;
/** Larger files are moved aside and unlinked on the thread pool (a tmpfs unlink is slow). */
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

  /** Uses `dir` (created if missing); `unlinkLarge` unlinks a large dropped file off the loop. */
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

  /** Stores a blob pinned once; `retain` offers it to the LRU (if under a quarter of capacity). */
  async putPinned(sha256: string, bytes: Uint8Array, retain: boolean): Promise<void> {
    await this.#put(sha256, bytes.length, retain, () => this.#write(sha256, bytes), null);
  }

  /**
   * {@linkcode putPinned} for bytes already in file `path` (in this directory): renamed into place
   * (`true`) or deleted when the blob is already stored (`false`); on failure left to the caller.
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

  /** Resolves once the files of blobs dropped so far are unlinked. */
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
      // Small files: a thread-pool round trip costs more than the copy.
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
      // Out of the blob's name at once (it may be stored again), then unlinked off the loop.
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
