/**
 * The persistent disk cache for file uploads: `<dir>/v1/<first two hex>/<sha256>`, atomic writes
 * under an exclusive lock, SHA-256 re-verified on every read, mtime as the LRU clock. Best
 * effort: every storage error is a miss or a skipped write.
 *
 * @module
 */
import { writeNewFile } from "./_write_file.ts";
import { sha256Hex } from "../../protocol/hash.ts";
import { CacheCounters } from "./cache_counters.ts";

/** The disk file cache; disabled when its directory is `null` or its capacity is 0. */
export class DiskFileCache {
  /** The cache root (`<dir>/v1` holds the objects), or `null` when disabled. */
  readonly dir: string | null;
  /** Capacity in bytes. */
  readonly capacityBytes: number;
  /** Hits, misses (counted by the blob resolution) and evictions. */
  readonly counters: CacheCounters = new CacheCounters();
  #bytes = 0;

  /** Opens the cache; call {@linkcode DiskFileCache.prepare} before use. */
  constructor(dir: string | null, capacityBytes: number) {
    this.dir = dir && capacityBytes > 0 ? dir : null;
    this.capacityBytes = capacityBytes;
  }

  /** Whether the cache stores anything. */
  get enabled(): boolean {
    return this.dir !== null;
  }

  /** Bytes stored, as measured at start and after the last write batch. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Creates the directory and evicts down to capacity (removing stale temporary files). */
  async prepare(): Promise<void> {
    if (!this.dir) return;
    try {
      await Deno.mkdir(`${this.dir}/v1`, { recursive: true, mode: 0o700 });
      await this.#locked(() => this.#evict());
    } catch {
      // best effort
    }
  }

  /** Returns the bytes of `sha256` if cached and intact (a corrupt object is a miss). */
  async get(sha256: string): Promise<Uint8Array | null> {
    if (!this.dir) return null;
    const path = this.#path(sha256);
    try {
      const info = await Deno.lstat(path);
      if (!info.isFile) return null;
      const bytes = await Deno.readFile(path);
      if (sha256Hex(bytes) !== sha256) return null;
      const now = new Date();
      await Deno.utime(path, now, now).catch(() => {});
      return bytes;
    } catch {
      return null;
    }
  }

  /** Stores a batch of objects (skipping ones larger than the capacity), then evicts. */
  async putBatch(entries: Iterable<[string, Uint8Array]>): Promise<void> {
    if (!this.dir) return;
    const list = [...entries].filter(([, bytes]) => bytes.length <= this.capacityBytes);
    if (list.length === 0) return;
    try {
      await this.#locked(async () => {
        for (const [sha256, bytes] of list) {
          const path = this.#path(sha256);
          const shard = path.slice(0, path.lastIndexOf("/"));
          try {
            await Deno.mkdir(shard, { recursive: true, mode: 0o700 });
            const tmp = `${shard}/.tmp-${crypto.randomUUID()}`;
            await writeNewFile(tmp, bytes, 0o600);
            await Deno.rename(tmp, path);
          } catch {
            // skipped write
          }
        }
        await this.#evict();
      });
    } catch {
      // best effort
    }
  }

  #path(sha256: string): string {
    return `${this.dir}/v1/${sha256.slice(0, 2)}/${sha256}`;
  }

  async #locked<T>(fn: () => Promise<T>): Promise<T> {
    const lock = await Deno.open(`${this.dir}/v1/.lock`, {
      create: true,
      write: true,
      mode: 0o600,
    });
    try {
      await lock.lock(true);
      return await fn();
    } finally {
      lock.close();
    }
  }

  async #evict(): Promise<void> {
    const objects: { path: string; size: number; mtime: number }[] = [];
    let total = 0;
    for await (const shard of Deno.readDir(`${this.dir}/v1`)) {
      if (!shard.isDirectory || !/^[0-9a-f]{2}$/.test(shard.name)) continue;
      const shardDir = `${this.dir}/v1/${shard.name}`;
      for await (const entry of Deno.readDir(shardDir)) {
        const path = `${shardDir}/${entry.name}`;
        try {
          if (entry.name.startsWith(".tmp-")) {
            const info = await Deno.lstat(path);
            // A temporary file older than a minute was left by a crashed writer.
            if (Date.now() - (info.mtime?.getTime() ?? 0) > 60_000) await Deno.remove(path);
            continue;
          }
          if (!entry.isFile) continue;
          const info = await Deno.lstat(path);
          objects.push({ path, size: info.size, mtime: info.mtime?.getTime() ?? 0 });
          total += info.size;
        } catch {
          // vanished
        }
      }
    }
    this.#bytes = total;
    if (total <= this.capacityBytes) return;
    objects.sort((a, b) => a.mtime - b.mtime);
    for (const object of objects) {
      if (total <= this.capacityBytes) break;
      try {
        await Deno.remove(object.path);
        total -= object.size;
        this.counters.evictions++;
      } catch {
        // vanished
      }
    }
    this.#bytes = total;
  }
}
