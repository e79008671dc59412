/**
 * The manifest of the Python worker runtime (`runtime_py/kcoral_runtime`): every file's SHA-256,
 * and one package hash over them that names the runtime's place in the user's cache before
 * anything is fetched. The manifest is generated (`deno task runtime-manifest` writes
 * `runtime_py/runtime_manifest.json`) and travels with the code as a JSON import, so a node that
 * runs from a registry, an HTTP URL or a compiled binary knows it without network.
 *
 * The package hash is the SHA-256 of the lines `<sha256>  <path>\n` sorted by path, the output
 * of `sha256sum` over the files, so it can be checked by hand:
 * `cd runtime_py/kcoral_runtime && find . -name '*.py' -not -path '*__pycache__*' | sed 's|^\./||'
 * | LC_ALL=C sort | xargs sha256sum | sha256sum`.
 *
 * @module
 */

import { sha256Hex } from "../protocol/hash.ts";
import manifest from "../runtime_py/runtime_manifest.json" with { type: "json" };

/** The files of the runtime package and the hash that names the package. */
export interface RuntimeManifest {
  /** SHA-256 (lowercase hex) of the `sha256sum` listing of {@linkcode files}. */
  readonly hash: string;
  /** Each file's path inside `kcoral_runtime/` (`/`-separated) and its SHA-256, by path. */
  readonly files: Readonly<Record<string, string>>;
}

/**
 * The manifest of the runtime package this code was built with (kept equal to the directory by
 * `tests/runtime_files_test.ts`).
 *
 * @example
 * ```ts
 * import { RUNTIME_MANIFEST } from "./runtime_manifest.ts";
 *
 * if (!/^[0-9a-f]{64}$/.test(RUNTIME_MANIFEST.hash)) throw new Error();
 * if (!RUNTIME_MANIFEST.files["zygote.py"]) throw new Error();
 * ```
 */
export const RUNTIME_MANIFEST: RuntimeManifest = manifest;

/**
 * The package hash of `files` (path → SHA-256): the SHA-256 of their `sha256sum` listing.
 *
 * @example
 * ```ts
 * import { packageHash, RUNTIME_MANIFEST } from "./runtime_manifest.ts";
 *
 * if (packageHash(RUNTIME_MANIFEST.files) !== RUNTIME_MANIFEST.hash) throw new Error();
 * ```
 */
export function packageHash(files: Readonly<Record<string, string>>): string {
  const listing = Object.keys(files).sort(_byteOrder).map((path) => `${files[path]}  ${path}\n`)
    .join("");
  return sha256Hex(new TextEncoder().encode(listing));
}

/**
 * The manifest of the package directory at `dir` (a `file:` URL, or a path): its `.py` files,
 * outside `__pycache__`.
 *
 * @example
 * ```ts
 * import { computeManifest } from "./runtime_manifest.ts";
 *
 * const dir = await Deno.makeTempDir();
 * await Deno.mkdir(`${dir}/tools`);
 * await Deno.writeTextFile(`${dir}/tools/a.py`, "x = 1\n");
 * await Deno.writeTextFile(`${dir}/notes.txt`, "not part of the package");
 * const manifest = await computeManifest(dir);
 * if (Object.keys(manifest.files).join() !== "tools/a.py") throw new Error();
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function computeManifest(dir: string | URL): Promise<RuntimeManifest> {
  const root = typeof dir === "string" ? dir : decodeURIComponent(dir.pathname);
  const paths = (await _walk(root.replace(/\/+$/, ""), "")).sort(_byteOrder);
  const files: Record<string, string> = {};
  for (const path of paths) files[path] = sha256Hex(await Deno.readFile(`${root}/${path}`));
  return { hash: packageHash(files), files };
}

async function _walk(dir: string, prefix: string): Promise<string[]> {
  const out: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (entry.name === "__pycache__") continue;
    if (entry.isDirectory) {
      out.push(...await _walk(`${dir}/${entry.name}`, `${prefix}${entry.name}/`));
    } else if (entry.isFile && entry.name.endsWith(".py")) out.push(`${prefix}${entry.name}`);
  }
  return out;
}

function _byteOrder(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
