/**
 * Writes a whole buffer to a new file for the blob caches (one open file written in place is
 * about twice as fast as `Deno.writeFile` for large buffers).
 *
 * @module
 */

/** Creates `path` (which must not exist) with `mode` and writes all of `bytes` to it. */
export async function writeNewFile(path: string, bytes: Uint8Array, mode: number): Promise<void> {
  const file = await Deno.open(path, { write: true, createNew: true, mode });
  try {
    await writeAll(file, bytes);
  } finally {
    file.close();
  }
}

/** Writes all of `bytes` to `file` at its position. */
export async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await file.write(rest));
}
