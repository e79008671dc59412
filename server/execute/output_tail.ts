/**
 * The `output_tail` of a request whose worker died or was killed, for the event log only: the
 * last bytes of the program's stdout and stderr capture files.
 *
 * @module
 */
import { openWorkerFile, readFully } from "../workers/worker_files.ts";

/** How much of the end of each stream goes into `output_tail` (as upstream). */
const _OUTPUT_TAIL_BYTES = 4096;

/**
 * `"[out] <tail>\n[err] <tail>"` (empty streams left out). Non-regular files are skipped and NUL
 * bytes dropped (a capture cut back may end in a hole); with capture off, `slotStderr` (what the
 * slot wrote during the request) is the stderr tail.
 */
export async function outputTail(resultsDir: string, slotStderr = ""): Promise<string> {
  const chunks: string[] = [];
  for (const [name, tag] of [["stdout", "out"], ["stderr", "err"]]) {
    let text = await _tail(`${resultsDir}/${name}`);
    if (!text && tag === "err") text = slotStderr.slice(-_OUTPUT_TAIL_BYTES);
    if (text) chunks.push(`[${tag}] ${text}`);
  }
  return chunks.join("\n");
}

async function _tail(path: string): Promise<string> {
  let file: Deno.FsFile;
  try {
    file = await openWorkerFile(path);
  } catch {
    return ""; // absent (capture off, or nothing started), or not a regular file
  }
  try {
    const size = (await file.stat()).size;
    const start = Math.max(0, size - _OUTPUT_TAIL_BYTES);
    await file.seek(start, Deno.SeekMode.Start);
    const buffer = new Uint8Array(size - start);
    const got = await readFully(file, buffer);
    return new TextDecoder().decode(buffer.subarray(0, got)).replaceAll("\0", "");
  } catch {
    return "";
  } finally {
    file.close();
  }
}
