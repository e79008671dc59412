/**
 * Worker side of protocol/hash_threads.ts: incremental SHA-256 per id over transferred buffers
 * (each sent back for reuse) or over ranges of shared memory; spools, which write ranges of
 * shared memory to a new file instead; and copies of a file into a new one, hashed on the way.
 *
 * @module
 */

import { createHash, type Hash } from "node:crypto";

interface _Spool {
  path: string;
  file: Deno.FsFile | null;
  written: number;
  /** Writes run in order, off this thread (the runtime's I/O threads). */
  chain: Promise<void>;
}

const hashes = new Map<number, Hash>();
const spools = new Map<number, _Spool>();
const scope = self as unknown as Worker;

scope.onmessage = (event: MessageEvent) => {
  const message = event.data;
  const id: number = message.id;
  if (message.t === "spool") {
    let file: Deno.FsFile | null = null;
    try {
      file = Deno.openSync(message.path, { write: true, createNew: true, mode: 0o644 });
    } catch {
      // no file: the spool reports that nothing was written
    }
    spools.set(id, { path: message.path, file, written: 0, chain: Promise.resolve() });
  } else if (message.t === "update") {
    const spool = spools.get(id);
    // Copied bytes are not written: a spool given any loses its file.
    if (spool) spool.chain = spool.chain.then(() => _close(spool));
    else _hash(id).update(new Uint8Array(message.buffer, 0, message.length));
    scope.postMessage({ t: "buffer", buffer: message.buffer }, [message.buffer]);
  } else if (message.t === "shared") {
    // Bytes the sender keeps unchanged in shared memory until the end of this id.
    const bytes = new Uint8Array(message.buffer, message.offset, message.length);
    const spool = spools.get(id);
    if (spool) spool.chain = spool.chain.then(() => _write(spool, bytes));
    else _hash(id).update(bytes);
  } else if (message.t === "digest") {
    const value = (hashes.get(id) ?? createHash("sha256")).digest("hex");
    hashes.delete(id);
    scope.postMessage({ t: "reply", id, value });
  } else if (message.t === "written") {
    const spool = spools.get(id);
    spools.delete(id);
    if (!spool) {
      scope.postMessage({ t: "reply", id, value: null });
      return;
    }
    spool.chain.then(() => {
      const value = spool.file ? spool.written : null;
      _close(spool);
      scope.postMessage({ t: "reply", id, value });
    });
  } else if (message.t === "copy") {
    try {
      const value = _copyHashing(message.from, message.to, message.size, message.ino, message.dev);
      scope.postMessage({ t: "reply", id, value });
    } catch (error) {
      scope.postMessage({
        t: "reply",
        id,
        error: error instanceof Error ? error.message : `${error}`,
        source: error instanceof _SourceError,
      });
    }
  } else if (message.t === "drop") {
    // A body given up before this payload ended: no end, and a spool's file goes.
    hashes.delete(id);
    const spool = spools.get(id);
    spools.delete(id);
    if (spool) {
      spool.chain = spool.chain.then(async () => {
        _close(spool);
        await Deno.remove(spool.path).catch(() => {});
      });
    }
  }
};

/** The file to copy is not the one its caller opened and checked (its owner's doing). */
class _SourceError extends Error {}

/** A copy's buffer, made on the first copy and kept: reads, hashes and writes go through it. */
let _copyBuffer: Uint8Array | null = null;

/** Copies the file `from` (which must be `ino` on `dev`, `size` bytes) into the new `to`. */
function _copyHashing(from: string, to: string, size: number, ino: number | null, dev: number) {
  const hash = createHash("sha256");
  using source = Deno.openSync(from, { read: true });
  const found = source.statSync();
  if (!found.isFile || found.ino !== ino || found.dev !== dev) {
    throw new _SourceError(`${from} is not the file that was opened`);
  }
  if (found.size !== size) throw new _SourceError(`${from} has ${found.size} bytes, not ${size}`);
  using target = Deno.openSync(to, { write: true, createNew: true, mode: 0o644 });
  const buffer = _copyBuffer ??= new Uint8Array(_COPY_PIECE);
  let copied = 0;
  for (;;) {
    const n = source.readSync(buffer);
    if (n === null) break;
    copied += n;
    if (copied > size) break;
    const piece = buffer.subarray(0, n);
    hash.update(piece);
    for (let at = 0; at < n;) at += target.writeSync(piece.subarray(at));
  }
  if (copied !== size) throw new _SourceError(`${from} changed size`);
  return hash.digest("hex");
}

const _COPY_PIECE = 4 << 20;

function _hash(id: number): Hash {
  let hash = hashes.get(id);
  if (!hash) hashes.set(id, hash = createHash("sha256"));
  return hash;
}

async function _write(spool: _Spool, bytes: Uint8Array): Promise<void> {
  if (!spool.file) return;
  try {
    let rest = bytes;
    while (rest.length > 0) rest = rest.subarray(await spool.file.write(rest));
    spool.written += bytes.length;
  } catch {
    _close(spool); // the file is then unusable: the spool reports no file
  }
}

function _close(spool: _Spool): void {
  try {
    spool.file?.close();
  } catch {
    // already closed
  }
  spool.file = null;
}
