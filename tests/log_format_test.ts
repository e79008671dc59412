/**
 * `--log-format json` (and `KCORAL_LOG_FORMAT=json`): every console line of a server, a Router
 * and a node's supervisor is one JSON object, the events with the very fields `events.jsonl`
 * has; the default stays text.
 */
import assert from "node:assert/strict";
import { Client, Program } from "../mod.ts";
import { startServer } from "./_server.ts";
import { KcoralProcess, startNode, startRouter, waitForCapacity, waitUntil } from "./_router.ts";
import { trivialProgram } from "../bench/_programs.ts";

/** A program that sleeps `seconds` on its worker. */
function sleepProgram(seconds: number): Program {
  const program = new Program();
  const mod = program.upload({
    kind: "module",
    source: `import time\ndef nap():\n    time.sleep(${seconds})\n    return 1\n`,
  });
  const fn = program.getFunction({ module: mod, name: "nap" });
  program.return_({ key: "n", value: program.run({ fn }) });
  return program;
}

function parsed(lines: string[]): Record<string, unknown>[] {
  return lines.filter((l) => l.trim() !== "").map((line) => {
    try {
      return JSON.parse(line);
    } catch {
      throw new Error(`not a JSON line: ${line}`);
    }
  });
}

Deno.test("log format: a server's console lines are the events.jsonl records", async () => {
  const lines: string[] = [];
  const server = await startServer({ logConsole: true, logFormat: "json" }, {
    consoleWrite: (line) => lines.push(line),
  });
  try {
    await using client = new Client(server.url);
    await client.execute(trivialProgram());
  } finally {
    await server.stop();
  }
  const records = parsed(lines);
  const finished = records.find((r) => r.event === "request_finished");
  assert.ok(finished, lines.join("\n"));
  const logged = server.events.find((r) => r.event === "request_finished")!;
  assert.deepEqual(finished, JSON.parse(JSON.stringify(logged)));
  assert.ok(records.every((r) => typeof r.timestamp === "string" && typeof r.level === "string"));
});

Deno.test("log format: text stays the default", async () => {
  const lines: string[] = [];
  const server = await startServer({ logConsole: true }, {
    consoleWrite: (line) => lines.push(line),
  });
  await server.stop();
  assert.ok(lines.length > 0);
  assert.ok(lines.every((line) => !line.startsWith("{")), lines.join("\n"));
  assert.match(lines[0], /^\d{4}-\d\d-\d\dT[\d:.]+Z INFO +server_started$/);
});

Deno.test({
  name: "log format: router, supervisor and node server all write JSON lines",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const router = await startRouter(["--log-format", "json"]);
    const node = await startNode(router.url, "cpu-json", {
      env: { KCORAL_LOG_FORMAT: "json" },
      extra: ["--no-log-console"],
    });
    try {
      await waitForCapacity(router.url, 1);
      await using client = new Client(router.url);
      await client.execute(trivialProgram());
      // Two at once on a node of one worker: one waits in the Router's queue, which watches its
      // client (that must not print a line of its own).
      const outcomes = await Promise.all(
        [sleepProgram(0.3), trivialProgram()].map((p) => client.execute(p)),
      );
      assert.ok(outcomes.every((outcome) => outcome.completed));
      await waitUntil(
        "the Router's request_finished",
        () => router.process.lines.some((l) => l.includes('"event":"request_finished"')),
      );
    } finally {
      await node.stop();
      await router.stop();
    }
    const routerRecords = parsed(router.process.lines);
    assert.ok(routerRecords.some((r) => String(r.message).startsWith("KCoral router listening")));
    const finished = routerRecords.find((r) => r.event === "request_finished")!;
    assert.equal(finished.node, "cpu-json");
    assert.equal(finished.finish_reason, "completed");
    const nodeRecords = parsed(node.process.lines);
    assert.ok(
      nodeRecords.some((r) => r.event === "supervisor" && r.node_id === "cpu-json"),
      node.process.lines.join("\n"),
    );
  },
});

Deno.test("log format: an unknown format is refused with the choices", async () => {
  const run = new KcoralProcess(["router", "--log-format", "xml"]);
  const status = await run.status;
  assert.equal(status.code, 2);
  assert.match(run.lines.join("\n"), /--log-format.*xml/);
});
