/**
 * The module graph has no import circles (type-only imports count: a circle of types is still a
 * circle a reader has to untangle), and the layers point one way: `protocol/` imports nothing of
 * ours but itself, `client/` nothing of `server/`, `http/` or `cli/`, `http/` nothing of
 * `server/`, and `cli/run/` nothing of `server/`. The two apps meet only through the node link:
 * `link/` (framing, bodies, the WebSocket client, backoff) knows neither app; `router/` uses
 * `link/` and never `server/` or `node/`; `node/` (the supervisor and a node's links) uses
 * `server/` and `link/`; `server/` uses neither. Inside the server the wings point one way too:
 * `execute/` (the request's stages) uses `workers/` and `cache/`; `workers/` knows nothing of the
 * stages or the caches; `cache/` and `runtime/` stand alone.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);

/** Local module → the local modules it imports (from `deno info --json` of each entry). */
async function graph(entries: string[]): Promise<Map<string, string[]>> {
  const modules = [];
  for (const entry of entries) {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json", entry],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(output.success, new TextDecoder().decode(output.stderr));
    modules.push(...JSON.parse(new TextDecoder().decode(output.stdout)).modules);
  }
  const local = (specifier: string) =>
    specifier.startsWith(ROOT.href) ? specifier.slice(ROOT.href.length) : null;
  const edges = new Map<string, string[]>();
  for (const module of modules) {
    const from = local(module.specifier);
    if (!from) continue;
    const to = new Set<string>();
    for (const dep of module.dependencies ?? []) {
      for (const kind of ["code", "type"]) {
        const target = dep[kind]?.specifier && local(dep[kind].specifier);
        if (target && target !== from) to.add(target);
      }
    }
    edges.set(from, [...to]);
  }
  return edges;
}

/** Each layer (a path prefix) and the layers it must not import. */
const RULES: [string, string[]][] = [
  ["protocol/", ["client/", "server/", "http/", "cli/", "link/", "router/", "node/"]],
  ["client/", ["server/", "http/", "cli/", "link/", "router/", "node/"]],
  ["http/", ["server/", "client/", "cli/", "link/", "router/", "node/"]],
  ["link/", ["server/", "router/", "node/", "client/", "cli/"]],
  ["cli/run/", ["server/", "router/", "node/"]],
  ["router/", ["server/", "node/", "client/", "cli/"]],
  ["node/", ["router/", "client/", "cli/"]],
  ["server/", ["router/", "node/", "link/", "client/", "cli/"]],
  ["server/workers/", ["server/execute/", "server/cache/", "server/runtime/"]],
  ["server/cache/", ["server/execute/", "server/workers/", "server/runtime/"]],
  ["server/runtime/", ["server/execute/", "server/workers/", "server/cache/"]],
];

/** The edges of `edges` that go against {@linkcode RULES}, as `from → to`. */
function layerViolations(edges: Map<string, string[]>): string[] {
  const broken: string[] = [];
  for (const [from, targets] of edges) {
    for (const [layer, forbidden] of RULES) {
      if (!from.startsWith(layer)) continue;
      for (const target of targets) {
        if (forbidden.some((f) => target.startsWith(f))) broken.push(`${from} → ${target}`);
      }
    }
  }
  return broken;
}

Deno.test("import graph: no circles, and the layers point one way", async () => {
  const edges = await graph([
    "mod.ts",
    "cli.ts",
    "http/mod.ts",
    "server/app.ts",
    "router/app.ts",
    "cli/router.ts",
    "node/linked_app.ts",
    "node/supervisor/supervisor.ts",
  ]);
  assert.ok(edges.size > 50, `only ${edges.size} modules seen`);
  // Depth-first search for a back edge.
  const state = new Map<string, "open" | "done">();
  const cycles: string[] = [];
  const visit = (node: string, path: string[]) => {
    state.set(node, "open");
    for (const next of edges.get(node) ?? []) {
      if (state.get(next) === "open") {
        cycles.push([...path.slice(path.indexOf(next)), next].join(" → "));
      } else if (!state.has(next)) visit(next, [...path, next]);
    }
    state.set(node, "done");
  };
  for (const node of edges.keys()) if (!state.has(node)) visit(node, [node]);
  assert.deepEqual(cycles, [], `import circles:\n${cycles.join("\n")}`);

  const broken = layerViolations(edges);
  assert.deepEqual(broken, [], `imports against the layers:\n${broken.join("\n")}`);
});

Deno.test("import graph: the layer rules catch an import across the node link's boundaries", () => {
  const edges = new Map([
    ["server/app.ts", ["link/body_sender.ts", "http/events.ts"]],
    ["router/hub.ts", ["link/messages.ts", "node/slot_links.ts"]],
    ["router/exchange.ts", ["server/app.ts"]],
    ["link/body_sender.ts", ["router/slot_link.ts", "protocol/bytes.ts"]],
    ["node/slot_links.ts", ["server/app.ts", "link/body_sender.ts", "router/hub.ts"]],
    ["http/serve.ts", ["link/websocket_client.ts"]],
  ]);
  assert.deepEqual(layerViolations(edges), [
    "server/app.ts → link/body_sender.ts",
    "router/hub.ts → node/slot_links.ts",
    "router/exchange.ts → server/app.ts",
    "link/body_sender.ts → router/slot_link.ts",
    "node/slot_links.ts → router/hub.ts",
    "http/serve.ts → link/websocket_client.ts",
  ]);
});
