/**
 * The `output_tail` of a request whose worker died or was killed (spec server §4.3): the last
 * bytes of what the program wrote to stdout and stderr, for the event log only (never for the
 * client). Read from the capture files the child left in its results directory.
 *
 * @module
 */
import { openWorkerFile, readFully } from "../workers/worker_files.ts";

/** How much of the end of each stream goes into `output_tail` (as upstream). */
const _OUTPUT_TAIL_BYTES = 4096;

/**
 * `"[out] <tail of stdout>\n[err] <tail of stderr>"` (a stream that holds nothing is left out),
 * or `""` when neither holds anything. `resultsDir` is the host path of the results directory
 * the child captured into (`stdout` and `stderr` files). A file that is not a regular file is
 * skipped, never followed. NUL bytes are dropped: past the capture limit the files may end in a
 * hole (the capture guard cut them back). With capture off (`output_limit_bytes` 0) a program
 * writes to the slot's own stderr: `slotStderr`, what the slot wrote during the request, is then
 * the stderr tail.
 *
 * @example
 * ```ts
 * import { outputTail } from "./output_tail.ts";
 *
 * const dir = await Deno.makeTempDir();
 * await Deno.writeTextFile(`${dir}/stderr`, "fatal: simulated device-side assert\n");
 * if (await outputTail(dir) !== "[err] fatal: simulated device-side assert\n") throw new Error();
 * await Deno.remove(dir, { recursive: true });
 * ```
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
