/**
 * The layout of help text as Python's argparse prints it (which upstream KCoral's commands
 * print): a usage line wrapped under its prefix, option rows with descriptions from column 24,
 * text wrapped at 80 columns. Shared by every `kcoral` command's `--help`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { helpRow, usageLines } from "./help_layout.ts";
 *
 * assert.equal(usageLines("kcoral health", ["[-h]", "[--url URL]"]), "usage: kcoral health [-h] [--url URL]\n");
 * assert.equal(helpRow("  --url URL", "server URL"), "  --url URL             server URL");
 * ```
 *
 * @module
 */

/** The width help text is wrapped at. */
export const HELP_WIDTH = 80;
/** The column option descriptions start at. */
export const HELP_COLUMN = 24;

/**
 * `usage: PROG GROUP...`, wrapped at {@linkcode HELP_WIDTH} with continuation lines indented
 * under the first group (ends with a newline).
 *
 * @example
 * ```ts
 * import { usageLines } from "./help_layout.ts";
 *
 * const text = usageLines("kcoral server", Array.from({ length: 12 }, (_, i) => `[--option-${i} N]`));
 * if (!text.split("\n")[1].startsWith(" ".repeat("usage: kcoral server ".length) + "[")) {
 *   throw new Error(text);
 * }
 * ```
 */
export function usageLines(prog: string, groups: readonly string[]): string {
  const prefix = `usage: ${prog} `;
  const indent = " ".repeat(prefix.length);
  const lines: string[] = [];
  let line = prefix;
  for (const group of groups) {
    if (line.length > prefix.length && line.length + 1 + group.length > HELP_WIDTH) {
      lines.push(line);
      line = indent;
    }
    line += (line.length > prefix.length && line !== indent ? " " : "") + group;
  }
  lines.push(line);
  return lines.map((text) => text.trimEnd()).join("\n") + "\n";
}

/**
 * One option row: the invocation, then the description from {@linkcode HELP_COLUMN}, wrapped;
 * an invocation too long for the column puts the description on the next lines.
 *
 * @example
 * ```ts
 * import { helpRow } from "./help_layout.ts";
 *
 * const row = helpRow("  --worker-termination-grace-seconds SECONDS", "grace");
 * if (row !== "  --worker-termination-grace-seconds SECONDS\n" + " ".repeat(24) + "grace") {
 *   throw new Error(row);
 * }
 * ```
 */
export function helpRow(invocation: string, description: string): string {
  const text = wrapText(description, HELP_COLUMN);
  if (invocation.length + 2 <= HELP_COLUMN) {
    return [invocation.padEnd(HELP_COLUMN) + text[0].trimStart(), ...text.slice(1)].join("\n");
  }
  return [invocation, ...text].join("\n");
}

/**
 * `text` wrapped at {@linkcode HELP_WIDTH}, every line indented by `indent` spaces.
 *
 * @example
 * ```ts
 * import { wrapText } from "./help_layout.ts";
 *
 * const lines = wrapText("word ".repeat(30).trim(), 4);
 * if (lines.length !== 2 || !lines.every((line) => line.startsWith("    word"))) {
 *   throw new Error(lines.join("\n"));
 * }
 * ```
 */
export function wrapText(text: string, indent: number): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(" ")) {
    if (line !== "" && indent + line.length + 1 + word.length > HELP_WIDTH) {
      lines.push(" ".repeat(indent) + line);
      line = word;
    } else {
      line = line === "" ? word : `${line} ${word}`;
    }
  }
  lines.push(" ".repeat(indent) + line);
  return lines;
}
