/**
 * The package's exports (deno.json): each one loads, and `./client` carries no server code and
 * no npm package (a client-only script downloads and checks the client and the wire format only).
 */
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);

async function _graph(entry: string): Promise<{ specifier: string; size?: number }[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT.pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  return JSON.parse(new TextDecoder().decode(out.stdout)).modules;
}

Deno.test("exports: every entry of deno.json exists", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  assert.deepEqual(Object.keys(config.exports), [".", "./client", "./server", "./router", "./cli"]);
  for (const path of Object.values(config.exports) as string[]) {
    await Deno.stat(new URL(path, ROOT));
  }
});

Deno.test("exports: ./client is the client and the wire format, nothing else", async () => {
  const modules = await _graph("client/mod.ts");
  const outside = modules
    .map((m) => m.specifier)
    .filter((s) => !s.startsWith("node:"))
    .map((s) => s.startsWith(ROOT.href) ? s.slice(ROOT.href.length) : s)
    .filter((s) => !s.startsWith("client/") && !s.startsWith("protocol/"));
  assert.deepEqual(outside, [], "./client reaches beyond client/ and protocol/");
  // Small enough to fetch for a script that only sends programs (docs/architecture.md).
  const bytes = modules.reduce((n, m) => n + (m.size ?? 0), 0);
  assert.ok(modules.length < 80 && bytes < 512 * 1024, `${modules.length} modules, ${bytes} B`);
});

Deno.test("exports: ./server and ./router load without the command line", async () => {
  for (const entry of ["server/mod.ts", "router/mod.ts"]) {
    const specifiers = (await _graph(entry)).map((m) => m.specifier);
    assert.ok(!specifiers.some((s) => s.endsWith("/cli.ts") || s.includes("/cli/")), entry);
    assert.ok(!specifiers.some((s) => s.includes("npm:commander") || s.includes("/commander/")));
  }
});
