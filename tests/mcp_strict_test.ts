/**
 * `kcoral mcp` for agent hosts that run it with the user's rights: every tool's input schema is
 * strict (a mistyped key is named), saved files come back as `resource_link` items too, and only
 * files under the working directory (or an `--allow-send-root`) are sent. The MCP process runs
 * with the narrow permissions docs/agents.md documents.
 */
import assert from "node:assert/strict";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { startServer } from "./_server.ts";

const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname);
const CLI = `${ROOT}cli.ts`;

/** The narrow `deno run` permissions of docs/agents.md for server `url` and `filesDir`. */
export function mcpPermissions(url: string, filesDir: string): string[] {
  return [`--allow-net=${new URL(url).host}`, "--allow-read=.", `--allow-write=${filesDir}`];
}

async function withMcp(
  extra: string[],
  body: (client: McpClient, cwd: string) => Promise<void>,
  permissions?: (url: string, filesDir: string) => string[],
): Promise<void> {
  const server = await startServer();
  const cwd = await Deno.makeTempDir({ prefix: "kcoral-mcp-strict-" });
  const filesDir = "saved";
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: [
      "run",
      ...(permissions ? permissions(server.url, filesDir) : ["-A"]),
      CLI,
      "mcp",
      "--url",
      server.url,
      "--files-dir",
      filesDir,
      "--inline-limit",
      "16",
      ...extra,
    ],
    env: { NO_COLOR: "1", PATH: Deno.env.get("PATH") ?? "", HOME: Deno.env.get("HOME") ?? "" },
    cwd,
    stderr: "pipe",
  });
  const client = new McpClient({ name: "kcoral-mcp-strict-test", version: "1.0.0" });
  try {
    await client.connect(transport);
    await body(client, cwd);
  } finally {
    await client.close();
    await server.stop();
    await Deno.remove(cwd, { recursive: true });
  }
}

async function call(client: McpClient, name: string, args: Record<string, unknown>) {
  return await client.callTool({ name, arguments: args }, undefined, {
    timeout: 120_000,
  }) as CallToolResult;
}

function text(result: CallToolResult): string {
  return (result.content[0] as { text: string }).text;
}

Deno.test("mcp strict: every tool's input schema refuses unknown keys, and names a typo", async () => {
  await withMcp([], async (client) => {
    const { tools } = await client.listTools();
    assert.ok(tools.length >= 5);
    for (const tool of tools) {
      assert.equal(
        (tool.inputSchema as { additionalProperties?: unknown }).additionalProperties,
        false,
        `${tool.name} accepts unknown keys`,
      );
    }
    const typo = await call(client, "run_python", { sourc: "print(1)" }).catch((error) => error);
    const message = typo instanceof Error ? typo.message : text(typo);
    assert.match(message, /sourc/, message);
    const health = await call(client, "health", { verbose: true }).catch((error) => error);
    assert.match(health instanceof Error ? health.message : text(health), /verbose/);
  });
});

Deno.test("mcp strict: with narrow permissions, files outside the working directory are refused", async () => {
  await withMcp([], async (client, cwd) => {
    await Deno.writeTextFile(`${cwd}/data.txt`, "inside\n");
    const inside = await call(client, "run_python", {
      source: "print(open('data.txt').read().strip())",
      send: ["data.txt"],
    });
    assert.notEqual(inside.isError, true, text(inside));
    assert.equal((inside.structuredContent as { stdout: string }).stdout, "inside\n");
    const outside = await call(client, "run_python", {
      source: "print(open('hostname').read())",
      send: ["/etc/hostname"],
    });
    assert.equal(outside.isError, true, text(outside));
    assert.match(text(outside), /^invalid_input: send: .*\/etc\/hostname/);
  }, mcpPermissions);
});

Deno.test("mcp strict: with -A too, only the working directory and --allow-send-root are sent from", async () => {
  const other = await Deno.makeTempDir({ prefix: "kcoral-mcp-other-" });
  try {
    await Deno.writeTextFile(`${other}/extra.txt`, "allowed\n");
    await withMcp(["--allow-send-root", other], async (client, cwd) => {
      const outside = await call(client, "run_python", { source: "pass", send: ["/etc/hostname"] });
      assert.match(text(outside), /outside the directories kcoral mcp may send from/);
      assert.match(text(outside), /--allow-send-root/);
      // A symlink inside the project that points outside is refused as well.
      await Deno.symlink("/etc", `${cwd}/etc-link`);
      const linked = await call(client, "run_python", {
        source: "pass",
        send: ["etc-link/hostname"],
      });
      assert.match(text(linked), /outside the directories/);
      const program = await call(client, "run_program", {
        instructions: [
          { op: "upload", kind: "bytes", id: "b", local_path: "/etc/hostname" },
          { op: "return", key: "b", value: { $ref: "b" } },
        ],
      });
      assert.match(text(program), /local_path: \/etc\/hostname is outside/);
      const evaluated = await call(client, "evaluate_kernel", {
        reference_path: "/etc/hostname",
        candidate: "x = 1\n",
      });
      assert.match(text(evaluated), /reference_path: \/etc\/hostname is outside/);
      const allowed = await call(client, "run_python", {
        source: "print(open('extra.txt').read().strip())",
        send: [`${other}/extra.txt`],
      });
      assert.equal((allowed.structuredContent as { stdout: string }).stdout, "allowed\n");
    });
  } finally {
    await Deno.remove(other, { recursive: true });
  }
});

Deno.test("mcp strict: a saved file comes back as a resource_link item as well", async () => {
  await withMcp([], async (client) => {
    const result = await call(client, "run_python", {
      source: "open('big.txt', 'w').write('x' * 100)",
      fetch: ["big.txt"],
    });
    assert.notEqual(result.isError, true, text(result));
    const files = (result.structuredContent as { files: { saved_path?: string }[] }).files;
    const saved = files[0].saved_path!;
    assert.ok(saved, JSON.stringify(files));
    const links = result.content.filter((item: { type: string }) =>
      item.type === "resource_link"
    ) as {
      uri: string;
      name: string;
      size?: number;
    }[];
    assert.equal(links.length, 1, JSON.stringify(result.content));
    assert.equal(links[0].name, "big.txt");
    assert.equal(links[0].size, 100);
    assert.equal(decodeURIComponent(new URL(links[0].uri).pathname), saved);
    assert.equal((await Deno.readTextFile(saved)).length, 100);
  });
});
