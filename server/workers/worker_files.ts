/**
 * Reading the files a worker wrote without trusting them: a file is opened only if it is the very
 * regular file `lstat` saw, so a program cannot swap in a symlink to a host file or a FIFO.
 *
 * @module
 */
import type { OutcomeFile, WorkerOutcome } from "./worker_protocol.ts";

/** Reads the head of a capture file: at most `limit` bytes, decoded as UTF-8 with replacement. */
export async function readCaptured(
  file: OutcomeFile | null,
  limit: number,
): Promise<{ text: string; truncated: boolean }> {
  // Nothing written (the worker's size, taken after capture ended): nothing to open.
  if (!file || limit === 0 || file.size === 0) return { text: "", truncated: false };
  const handle = await openWorkerFile(file.path);
  try {
    const size = (await handle.stat()).size;
    const want = Math.min(size, limit);
    const buffer = new Uint8Array(want);
    const got = await readFully(handle, buffer);
    return {
      text: new TextDecoder("utf-8").decode(buffer.subarray(0, got)),
      truncated: size > limit,
    };
  } finally {
    handle.close();
  }
}

/** A file a worker reported is not the regular file it claims to be (never follow it). */
export class WorkerFileError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "WorkerFileError";
  }
}

/** Opens a regular file a worker wrote: the very inode `lstat` saw, of `expectedSize` if given. */
export async function openWorkerFile(path: string, expectedSize?: number): Promise<Deno.FsFile> {
  const before = await Deno.lstat(path).catch(() => null);
  if (!before || !before.isFile) {
    throw new WorkerFileError(`worker result ${path} is not a regular file`);
  }
  const file = await Deno.open(path, { read: true });
  try {
    const after = await file.stat();
    if (!after.isFile || after.ino !== before.ino || after.dev !== before.dev) {
      throw new WorkerFileError(`worker result ${path} was replaced while being opened`);
    }
    if (expectedSize !== undefined && after.size !== expectedSize) {
      throw new WorkerFileError(
        `worker result ${path} has ${after.size} bytes, not ${expectedSize}`,
      );
    }
    return file;
  } catch (error) {
    file.close();
    throw error;
  }
}

/** Reads a whole worker result file safely (see {@linkcode openWorkerFile}). */
export async function readWorkerFile(path: string, expectedSize: number): Promise<Uint8Array> {
  const file = await openWorkerFile(path, expectedSize);
  try {
    const data = new Uint8Array(expectedSize);
    const got = await readFully(file, data);
    if (got !== expectedSize) throw new WorkerFileError(`worker result ${path} changed size`);
    return data;
  } finally {
    file.close();
  }
}

/** Reads into `buffer` until it is full or the file ends; returns the bytes read. */
export async function readFully(file: Deno.FsFile, buffer: Uint8Array): Promise<number> {
  let got = 0;
  while (got < buffer.length) {
    const n = await file.read(buffer.subarray(got));
    if (n === null) break;
    got += n;
  }
  return got;
}

/** The outcome with its worker paths (in `workerDir`) as host paths (in `hostDir`). */
export function hostPaths(
  outcome: WorkerOutcome,
  workerDir: string,
  hostDir: string,
): WorkerOutcome {
  const map = <T extends { path: string }>(file: T): T => {
    const name = file.path.slice(workerDir.length + 1);
    if (!file.path.startsWith(workerDir + "/") || name === "" || name.includes("/")) {
      throw new WorkerFileError(`worker result path outside its results directory: ${file.path}`);
    }
    return { ...file, path: hostDir + file.path.slice(workerDir.length) };
  };
  return {
    ...outcome,
    parts: (outcome.parts ?? []).map(map),
    ...(outcome.kept ? { kept: outcome.kept.map(map) } : {}),
    stdout: outcome.stdout ? map(outcome.stdout) : null,
    stderr: outcome.stderr ? map(outcome.stderr) : null,
    ...(outcome.results_file ? { results_file: map(outcome.results_file) } : {}),
  };
}
