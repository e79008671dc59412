/**
 * Workspace-relative path rules (spec protocol §2.6), with upstream's messages.
 *
 * @module
 */

import { pyStrRepr } from "./python_repr.ts";
import { comparePy } from "./python_str.ts";

/** A path that breaks the rules of spec §2.6; `message` is upstream's 400 text. */
export class PathError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string) {
    super(message);
    this.name = "PathError";
  }
}

const _encoder = new TextEncoder();
const _LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function _utf8Length(s: string): number {
  // Fast path for ASCII; TextEncoder for the rest (lone surrogates are rejected earlier).
  return !/[\u0080-\uffff]/.test(s) ? s.length : _encoder.encode(s).length;
}

/**
 * Validate and canonicalize a request-workspace-relative POSIX path (spec §2.6 rules 1–5):
 * non-empty string without NUL or backslash, not absolute, no `..` component (checked before
 * normalization), empty and `.` components dropped, at least one component left, components ≤ 255
 * UTF-8 bytes, result ≤ 4096 UTF-8 bytes.
 *
 * Upstream crashes (HTTP 500) on paths holding unpaired UTF-16 surrogates; here they are a
 * `PathError` like every other invalid path.
 *
 * @throws {PathError} with upstream's message.
 */
export function normalizeFilePath(path: unknown): string {
  if (typeof path !== "string" || path.length === 0) {
    throw new PathError("filesystem 'path' must be a non-empty string");
  }
  if (path.includes("\x00")) throw new PathError("filesystem 'path' must not contain NUL");
  if (path.includes("\\")) {
    throw new PathError("filesystem 'path' must use POSIX '/' separators");
  }
  if (path.startsWith("/")) throw new PathError("filesystem 'path' must be relative");
  const raw = path.split("/");
  if (raw.includes("..")) {
    throw new PathError("filesystem 'path' must not contain a '..' component");
  }
  const parts = raw.filter((part) => part !== "" && part !== ".");
  if (parts.length === 0) throw new PathError("filesystem 'path' must name a file or folder");
  if (_LONE_SURROGATE.test(path)) {
    throw new PathError("filesystem 'path' must not contain unpaired surrogates");
  }
  for (const part of parts) {
    if (_utf8Length(part) > 255) {
      throw new PathError("filesystem 'path' contains a component longer than 255 bytes");
    }
  }
  const normalized = parts.join("/");
  if (_utf8Length(normalized) > 4096) {
    throw new PathError("filesystem 'path' is longer than 4096 bytes");
  }
  return normalized;
}

/** Order two paths by their component lists, comparing components by code point. */
function _comparePathComponents(a: string, b: string): number {
  const x = a.split("/");
  const y = b.split("/");
  const n = Math.min(x.length, y.length);
  for (let i = 0; i < n; i++) {
    const order = comparePy(x[i], y[i]);
    if (order !== 0) return order;
  }
  return x.length - y.length;
}

/**
 * Reject duplicate normalized paths and file/directory conflicts (`a` next to `a/b`) among file
 * uploads, exactly as upstream: sort by component lists (Python code-point order) and compare
 * neighbours.
 *
 * @throws {PathError} `duplicate file upload path: 'p'` or `conflicting file upload paths: 'a' and
 * 'a/b'`.
 */
export function checkPathConflicts(paths: readonly string[]): void {
  const ordered = [...paths].sort(_comparePathComponents);
  for (let i = 1; i < ordered.length; i++) {
    const previous = ordered[i - 1];
    const current = ordered[i];
    if (current === previous) {
      throw new PathError(`duplicate file upload path: ${pyStrRepr(current)}`);
    }
    if (current.startsWith(previous + "/")) {
      throw new PathError(
        `conflicting file upload paths: ${pyStrRepr(previous)} and ${pyStrRepr(current)}`,
      );
    }
  }
}
