/**
 * The package's exports (deno.json): each one loads, `./client` carries no server code and no npm
 * package (a client-only script downloads and checks the client and the wire format only), and
 * none exports the node link's insides (link/, node/, a node's small-body entry).
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

/** The names an entry point exports, each with the module that declares it. */
async function _exported(entry: string): Promise<[string, string][]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["doc", "--json", entry],
    cwd: ROOT.pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  const doc = JSON.parse(new TextDecoder().decode(out.stdout));
  const symbols = doc.nodes[new URL(entry, ROOT).href].symbols as {
    name: string;
    declarations: { location: { filename: string } }[];
  }[];
  return symbols.map((s) => [s.name, s.declarations[0].location.filename.slice(ROOT.href.length)]);
}

Deno.test("exports: nothing of the node link's insides; the Router only what its registry's API names", async () => {
  const linkInternal = (file: string) =>
    file.startsWith("link/") || file.startsWith("node/") || file === "server/execute/intake.ts";
  for (const entry of ["mod.ts", "server/mod.ts"]) {
    const exported = await _exported(entry);
    assert.ok(exported.length > 10, `${entry}: ${exported.length} names`);
    assert.deepEqual(exported.filter(([, file]) => linkInternal(file)), [], entry);
  }
  // A NodeRegistry (RouterApp.registry) takes a node's status and a slot's hello and closes
  // connections with the link's codes: those, and nothing else of link/.
  const router = await _exported("router/mod.ts");
  assert.deepEqual(router.filter(([, file]) => linkInternal(file)).map(([name]) => name).sort(), [
    "LINK_CLOSE",
    "LinkCloseName",
    "NodeStatus",
    "SlotHello",
  ]);
});
