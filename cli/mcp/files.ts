/**
 * Files a tool call brings back: small UTF-8 text comes inline in the result; anything larger
 * or binary is saved under the directory the host allows (`kcoral mcp --files-dir`), in a
 * fresh subdirectory per call named after the tool and the time (`run_python-20261203-101500-1a2b`),
 * and the result names the saved path.
 *
 * @module
 */
import { z } from "zod";
import type { ReturnedFile } from "../../client/mod.ts";

/** The structured form of one returned file. */
export const fetchedFileSchema = z.object({
  path: z.string().describe("path relative to the remote working directory"),
  size: z.number().int().describe("size in bytes"),
  text: z.string().optional().describe("the contents, when small UTF-8 text"),
  saved_path: z.string().optional().describe("local path it was saved to, when not inline"),
});

/** One returned file, inline or saved. */
export type FetchedFile = z.infer<typeof fetchedFileSchema>;

const _decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * The local directory for one call's saved files, created on first use.
 *
 * @example
 * ```ts
 * import { ReturnedFile } from "../../client/mod.ts";
 * import { CallFiles } from "./files.ts";
 *
 * const root = await Deno.makeTempDir();
 * const files = new CallFiles(root, "run_python", 16);
 * const small = await files.describe("a.txt", new ReturnedFile(new TextEncoder().encode("hi\n")));
 * const large = await files.describe("b/c.txt", new ReturnedFile(new Uint8Array(64).fill(65)));
 * if (small.text !== "hi\n" || small.saved_path !== undefined) throw new Error();
 * if (!large.saved_path?.endsWith("/b/c.txt") || (await Deno.stat(large.saved_path)).size !== 64) {
 *   throw new Error();
 * }
 * await Deno.remove(root, { recursive: true });
 * ```
 */
export class CallFiles {
  readonly #root: string;
  readonly #tool: string;
  readonly #inlineLimit: number;
  #directory: string | undefined;

  /**
   * Files of one call of `tool`, saved under `root`; text up to `inlineLimit` bytes is
   * returned inline.
   */
  constructor(root: string, tool: string, inlineLimit: number) {
    this.#root = root;
    this.#tool = tool;
    this.#inlineLimit = inlineLimit;
  }

  /** Text files up to this many bytes (and bytes values up to it) are returned inline. */
  get inlineLimit(): number {
    return this.#inlineLimit;
  }

  /** This call's directory, if anything was saved. */
  get directory(): string | undefined {
    return this.#directory;
  }

  /**
   * Describe `file` (returned under `path`): inline text when it is small UTF-8 without NUL
   * and `save` is not forced, else saved to `<call directory>/<path>`.
   */
  async describe(path: string, file: ReturnedFile, save = false): Promise<FetchedFile> {
    if (!save && file.size <= this.#inlineLimit) {
      const text = _text(file.bytes());
      if (text !== undefined) return { path, size: file.size, text };
    }
    return { path, size: file.size, saved_path: await this.save(path, file.bytes()) };
  }

  /** Save `bytes` as `<call directory>/<path>` (parents created); resolves with the path. */
  async save(path: string, bytes: Uint8Array): Promise<string> {
    const directory = await this.#ensureDirectory();
    const target = `${directory}/${path}`;
    const parent = target.slice(0, target.lastIndexOf("/"));
    await Deno.mkdir(parent, { recursive: true });
    await Deno.writeFile(target, bytes, { createNew: true, mode: 0o600 });
    return target;
  }

  async #ensureDirectory(): Promise<string> {
    if (this.#directory !== undefined) return this.#directory;
    await Deno.mkdir(this.#root, { recursive: true });
    const root = await Deno.realPath(this.#root);
    const stamp = new Date().toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15);
    const suffix = crypto.randomUUID().slice(0, 4);
    const directory = `${root}/${this.#tool}-${stamp}-${suffix}`;
    await Deno.mkdir(directory, { mode: 0o700 });
    this.#directory = directory;
    return directory;
  }
}

function _text(bytes: Uint8Array): string | undefined {
  if (bytes.includes(0)) return undefined;
  try {
    return _decoder.decode(bytes);
  } catch {
    return undefined;
  }
}
