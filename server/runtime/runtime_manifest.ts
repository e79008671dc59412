/**
 * The manifest of the Python worker runtime: every file's SHA-256, and one package hash over them
 * that names the runtime's place in the user's cache. The package hash is the SHA-256 of the
 * `sha256sum` listing of the files (sorted by path), so it can be checked by hand.
 *
 * @module
 */

import { sha256Hex } from "../../protocol/hash.ts";

/** The files of the runtime package and the hash that names the package. */
export interface RuntimeManifest {
  /** SHA-256 (lowercase hex) of the `sha256sum` listing of {@linkcode files}. */
  readonly hash: string;
  /** Each file's path inside `kcoral_runtime/` (`/`-separated) and its SHA-256, by path. */
  readonly files: Readonly<Record<string, string>>;
}

/** The manifest of the runtime files `texts` (path → text, written as UTF-8). */
export function runtimeManifest(texts: ReadonlyMap<string, string>): RuntimeManifest {
  const encoder = new TextEncoder();
  const files: Record<string, string> = {};
  for (const path of [...texts.keys()].sort(_byteOrder)) {
    files[path] = sha256Hex(encoder.encode(texts.get(path)!));
  }
  return { hash: _packageHash(files), files };
}

/** The package hash of `files` (path → SHA-256): the SHA-256 of their `sha256sum` listing. */
function _packageHash(files: Readonly<Record<string, string>>): string {
  const listing = Object.keys(files).sort(_byteOrder).map((path) => `${files[path]}  ${path}\n`)
    .join("");
  return sha256Hex(new TextEncoder().encode(listing));
}

function _byteOrder(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
