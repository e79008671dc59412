/**
 * `resource_link` content items (MCP 2025-06-18) for the files a tool call saved locally: every
 * `saved_path` in a structured result (a fetched file, a returned tensor or bytes value, a
 * profiler report) becomes a link with a `file:` URI beside the JSON text, so a host can open or
 * attach the file instead of reading a path out of the text.
 *
 * @module
 */

/** A `resource_link` content item. */
export interface ResourceLink {
  /** Always `resource_link`. */
  type: "resource_link";
  /** The file's `file:` URI. */
  uri: string;
  /** The name shown: the remote path when the result gives one, else the file name. */
  name: string;
  /** Its size in bytes, when the result gives it. */
  size?: number;
  [key: string]: unknown;
}

/**
 * The links of every `saved_path` in `value`, in the order they appear (each path once).
 *
 * @example
 * ```ts
 * import { savedFileLinks } from "./resource_links.ts";
 *
 * const links = savedFileLinks({
 *   files: [{ path: "out/capture.ncu-rep", size: 9, saved_path: "/tmp/k/out/capture.ncu-rep" }],
 *   results: { y: { $bytes: { size: 4, saved_path: "/tmp/k/y b.bin" } } },
 * });
 * if (links.length !== 2 || links[0].name !== "out/capture.ncu-rep") throw new Error();
 * if (links[1].uri !== "file:///tmp/k/y%20b.bin" || links[1].size !== 4) throw new Error();
 * ```
 */
export function savedFileLinks(value: unknown): ResourceLink[] {
  const links: ResourceLink[] = [];
  const seen = new Set<string>();
  const visit = (node: unknown) => {
    if (Array.isArray(node)) {
      for (const item of node) visit(item);
      return;
    }
    if (typeof node !== "object" || node === null) return;
    const record = node as Record<string, unknown>;
    const saved = record.saved_path;
    if (typeof saved === "string" && saved.startsWith("/") && !seen.has(saved)) {
      seen.add(saved);
      links.push({
        type: "resource_link",
        uri: `file://${saved.split("/").map(encodeURIComponent).join("/")}`,
        name: typeof record.path === "string"
          ? record.path
          : saved.slice(saved.lastIndexOf("/") + 1),
        ...(typeof record.size === "number" ? { size: record.size } : {}),
      });
    }
    for (const child of Object.values(record)) visit(child);
  };
  visit(value);
  return links;
}
