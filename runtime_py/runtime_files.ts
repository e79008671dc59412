/**
 * Where the files of the Python worker runtime (`runtime_py/kcoral_runtime`)
 * are, and reading one of them as text.
 *
 * This module lives beside the package it locates, outside `server/` and
 * `cli/`, because both need it: the server starts workers from the package
 * (`server/runtime_files.ts` materializes it when needed), and `kcoral run`
 * uploads the tool runner sources in every request without depending on the
 * server. From a local checkout the URLs are `file:`; when this package runs
 * from a registry (`jsr:`) or an HTTP URL, they are `https:` URLs of the
 * published files, which travel with this module; in a `deno compile` binary
 * they are `file:` URLs of its embedded file system, which Python cannot open
 * (`server/runtime_files.ts` extracts them into the user's cache for it).
 *
 * @module
 */

/**
 * The URL of the `kcoral_runtime` package directory (with a trailing slash).
 *
 * @example
 * ```ts
 * import { RUNTIME_PACKAGE_URL } from "./runtime_files.ts";
 *
 * if (!RUNTIME_PACKAGE_URL.href.endsWith("/runtime_py/kcoral_runtime/")) throw new Error();
 * ```
 */
export const RUNTIME_PACKAGE_URL: URL = new URL("./kcoral_runtime/", import.meta.url);

/**
 * URL of a file of the runtime package (e.g. `tools/runner.py`).
 *
 * @example
 * ```ts
 * import { runtimeFileUrl } from "./runtime_files.ts";
 *
 * if (!runtimeFileUrl("tools/runner.py").pathname.endsWith("/kcoral_runtime/tools/runner.py")) {
 *   throw new Error();
 * }
 * ```
 */
export function runtimeFileUrl(name: string): URL {
  return new URL(name, RUNTIME_PACKAGE_URL);
}

/**
 * Reads one runtime file as text (local or remote).
 *
 * @example
 * ```ts
 * import { readRuntimeFile } from "./runtime_files.ts";
 *
 * const runner = await readRuntimeFile("tools/runner.py");
 * if (!runner.includes("def run(")) throw new Error();
 * ```
 */
export async function readRuntimeFile(name: string): Promise<string> {
  const url = runtimeFileUrl(name);
  // Inside a `deno compile` binary the `file:` URL is in its embedded file system, which
  // Deno's file APIs read.
  if (url.protocol === "file:") return await Deno.readTextFile(url);
  const fail = (reason: string) =>
    new Error(`cannot fetch the KCoral Python runtime (file ${name}) from ${url}: ${reason}`);
  let response: Response;
  try {
    response = await fetch(url);
  } catch (error) {
    const cause = (error as { cause?: unknown }).cause;
    throw fail(cause instanceof Error ? `${error} (${cause.message})` : String(error));
  }
  if (!response.ok) {
    await response.body?.cancel();
    throw fail(`HTTP ${response.status}`);
  }
  return await response.text();
}
