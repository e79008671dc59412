/**
 * What every `kcoral mcp` tool knows besides its arguments: the KCoral server (or Router) it
 * talks to, where saved files go, the directory local paths are relative to.
 *
 * @module
 */
import type { ClientOptions } from "../../client/mod.ts";

/** The settings of one `kcoral mcp` process. */
export interface McpSettings {
  /** The KCoral server or Router URL (`--url`). */
  url: string;
  /**
   * Client options of every server asked (`--url` and `--compile-url`): the client token
   * (`--token`, `KCORAL_TOKEN`) and trusted CAs (`--ca-file`, `KCORAL_CA_FILE`).
   */
  client?: ClientOptions;
  /** Where a compile for `benchmark_kernel` runs when the call names none (`--compile-url`). */
  compileUrl?: string;
  /** Directory the host allows for saved files (`--files-dir`), absolute or relative to `cwd`. */
  filesDir: string;
  /** Files (and bytes values) up to this many bytes come back inline (`--inline-limit`). */
  inlineLimit: number;
  /** The directory `send` paths are relative to, and the first one files may be sent from. */
  cwd: string;
  /** More directories local files may be sent from (`--allow-send-root`; cli/mcp/local_files.ts). */
  sendRoots?: readonly string[];
  /** Diagnostics (stderr: stdout carries the protocol). */
  log: (line: string) => void;
}

/**
 * `filesDir` resolved against `cwd`.
 *
 * @example
 * ```ts
 * import { filesRoot } from "./settings.ts";
 *
 * const settings = { url: "", filesDir: "out", inlineLimit: 1, cwd: "/work", log: () => {} };
 * if (filesRoot(settings) !== "/work/out") throw new Error();
 * ```
 */
export function filesRoot(settings: McpSettings): string {
  return settings.filesDir.startsWith("/")
    ? settings.filesDir
    : `${settings.cwd}/${settings.filesDir}`;
}
