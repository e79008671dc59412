/**
 * The files `kcoral eval --send` and the MCP tool `evaluate_kernel`'s `send` give every step's
 * worker: a file is stored under its name, a directory keeps its name (`exp` gives `exp/...`),
 * as `kcoral run --send` lays them out.
 *
 * @module
 */
import { basename, join, resolve } from "node:path";
import type { EvaluateFile } from "../client/mod.ts";

/** Files that add up to more than this are refused (they travel with each of three requests). */
export const MAX_SEND_BYTES = 256 << 20;

/**
 * Read `paths` (relative to `cwd`) into the files of an evaluation; throws an `Error` naming a
 * path that is missing, not a file or directory, or a total over {@linkcode MAX_SEND_BYTES}.
 *
 * @example
 * ```ts
 * import { readSendFiles } from "./eval_files.ts";
 *
 * const dir = await Deno.makeTempDir();
 * await Deno.mkdir(`${dir}/exp`);
 * await Deno.writeTextFile(`${dir}/exp/k.cu`, "// kernel");
 * const files = await readSendFiles(["exp"], dir);
 * if (files.length !== 1 || files[0].path !== "exp/k.cu") throw new Error();
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function readSendFiles(
  paths: readonly string[],
  cwd: string,
): Promise<{ path: string; data: Uint8Array }[]> {
  const files: EvaluateFile[] = [];
  let total = 0;
  const add = async (local: string, remote: string) => {
    const data = await Deno.readFile(local);
    total += data.length;
    if (total > MAX_SEND_BYTES) {
      throw new Error(`--send: the files add up to more than ${MAX_SEND_BYTES >> 20} MiB`);
    }
    files.push({ path: remote, data });
  };
  const walk = async (local: string, remote: string) => {
    const entries = [];
    for await (const entry of Deno.readDir(local)) entries.push(entry);
    entries.sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    for (const entry of entries) {
      const child = join(local, entry.name);
      if (entry.isDirectory) await walk(child, `${remote}/${entry.name}`);
      else if (entry.isFile) await add(child, `${remote}/${entry.name}`);
    }
  };
  for (const path of paths) {
    const local = resolve(cwd, path);
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(local);
    } catch (error) {
      throw new Error(`--send ${path}: ${(error as Error).message}`);
    }
    const name = basename(local);
    if (info.isDirectory) await walk(local, name);
    else if (info.isFile) await add(local, name);
    else throw new Error(`--send ${path}: not a file or directory`);
  }
  return files;
}
