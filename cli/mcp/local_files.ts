/**
 * Which local files `kcoral mcp` may send on an agent's behalf: those under its working
 * directory, and under each `--allow-send-root`. An agent host runs `kcoral mcp` with the user's
 * rights, so a tool argument naming `/etc/passwd` or `~/.ssh/id_ed25519` must not upload it.
 * Paths are checked after every symlink is resolved (`Deno.realPath`), so a link inside the
 * project that points outside is refused as well. Every tool that reads a local path calls
 * {@linkcode checkSendPath} first.
 *
 * @module
 */
import { ToolFailure } from "./call.ts";
import type { McpSettings } from "./settings.ts";

/**
 * The directories `settings` may send from, resolved: its working directory and its
 * `sendRoots`.
 *
 * @example
 * ```ts
 * import { sendRoots } from "./local_files.ts";
 *
 * const settings = { url: "", filesDir: "f", inlineLimit: 1, cwd: "/", log: () => {} };
 * if ((await sendRoots(settings)).join() !== "/") throw new Error();
 * ```
 */
export async function sendRoots(settings: McpSettings): Promise<string[]> {
  const roots = [settings.cwd, ...(settings.sendRoots ?? [])];
  return await Promise.all(roots.map((root) => Deno.realPath(root).catch(() => root)));
}

/**
 * `path` (relative to `settings.cwd`, or absolute) resolved, when it lies under a directory
 * `settings` may send from; a missing path passes (the reader says it is missing).
 *
 * @throws {ToolFailure} kind `invalid_input` naming the path, the allowed directories and how to
 * allow another.
 *
 * @example
 * ```ts
 * import { checkSendPath } from "./local_files.ts";
 *
 * const cwd = await Deno.makeTempDir();
 * await Deno.writeTextFile(`${cwd}/a.py`, "x = 1\n");
 * const settings = { url: "", filesDir: "f", inlineLimit: 1, cwd, log: () => {} };
 * await checkSendPath(settings, "a.py", "send");
 * const refused = await checkSendPath(settings, "/etc/hostname", "send").catch((e) => e.message);
 * if (!String(refused).includes("--allow-send-root")) throw new Error(refused);
 * await Deno.remove(cwd, { recursive: true });
 * ```
 */
export async function checkSendPath(
  settings: McpSettings,
  path: string,
  what: string,
): Promise<void> {
  const joined = path.startsWith("/") ? path : `${settings.cwd}/${path}`;
  let real: string;
  try {
    real = await Deno.realPath(joined);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return;
    throw new ToolFailure(
      "invalid_input",
      `${what}: cannot read ${path}: ${(error as Error).message}`,
    );
  }
  const roots = await sendRoots(settings);
  if (
    roots.some((root) => real === root || real.startsWith(root.endsWith("/") ? root : `${root}/`))
  ) {
    return;
  }
  throw new ToolFailure(
    "invalid_input",
    `${what}: ${path} is outside the directories kcoral mcp may send from (${roots.join(", ")}); ` +
      "start kcoral mcp in the project's directory, or allow another with --allow-send-root DIR",
  );
}
