/**
 * Writes `runtime_py/runtime_manifest.json`, the manifest of the Python worker runtime
 * (`server/runtime_manifest.ts`), from the files of `runtime_py/kcoral_runtime`. Run it after
 * changing a file of the runtime: `deno task runtime-manifest`.
 *
 * @module
 */

import { computeManifest, type RuntimeManifest } from "../server/runtime_manifest.ts";

/** Where the manifest is written. */
export const MANIFEST_URL: URL = new URL("../runtime_py/runtime_manifest.json", import.meta.url);

/**
 * The manifest file's text for `manifest` (JSON, two-space indents, a final newline).
 *
 * @example
 * ```ts
 * import { manifestText } from "./runtime_manifest.ts";
 *
 * const text = manifestText({ hash: "ab", files: { "a.py": "cd" } });
 * if (JSON.parse(text).files["a.py"] !== "cd" || !text.endsWith("}\n")) throw new Error();
 * ```
 */
export function manifestText(manifest: RuntimeManifest): string {
  return `${JSON.stringify({ hash: manifest.hash, files: manifest.files }, null, 2)}\n`;
}

if (import.meta.main) {
  const manifest = await computeManifest(new URL("../runtime_py/kcoral_runtime/", import.meta.url));
  await Deno.writeTextFile(MANIFEST_URL, manifestText(manifest));
  console.log(
    `${MANIFEST_URL.pathname}: ${Object.keys(manifest.files).length} files, ${manifest.hash}`,
  );
}
