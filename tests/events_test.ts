/** The event log: layout, events of a request, program records, console mirror, switches. */
import assert from "node:assert/strict";
import { EventLog, type EventLogOptions, isoNow } from "../http/events.ts";
import { callProgram, postProgram, startServer } from "./_server.ts";

/** An event log that writes no files and collects its console lines. */
function consoleOnlyLog(
  extra: Partial<EventLogOptions> = {},
): { log: EventLog; console: string[] } {
  const console: string[] = [];
  const log = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: (line) => console.push(line),
    ...extra,
  });
  return { log, console };
}

Deno.test("events: a server run writes events.jsonl and program records", async () => {
  const logDir = await Deno.makeTempDir();
  const console: string[] = [];
  const server = await startServer(
    { logDir, logConsole: true, logPrograms: true },
    { consoleWrite: (line) => console.push(line) },
  );
  let requestId = "";
  const program = callProgram("def f():\n    return 1\n", "f");
  try {
    const r = await postProgram(server.url, program);
    requestId = String(r.json.request_id);
  } finally {
    await server.stop();
  }
  try {
    const runs = [...Deno.readDirSync(`${logDir}/runs`)].map((e) => e.name);
    assert.equal(runs.length, 1);
    assert.match(runs[0], /^\d{8}T\d{6}\.\d{6}Z$/);
    const runDir = `${logDir}/runs/${runs[0]}`;
    const lines = Deno.readTextFileSync(`${runDir}/events.jsonl`).trim().split("\n").map((l) =>
      JSON.parse(l)
    );
    for (const line of lines) {
      assert.deepEqual(Object.keys(line).slice(0, 3), ["timestamp", "level", "event"]);
      assert.match(line.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    }
    const names = lines.map((l) => l.event);
    for (
      const name of [
        "server_started",
        "pool_ready",
        "request_received",
        "request_accepted",
        "request_routed",
        "request_finished",
        "shutdown_started",
        "shutdown_complete",
        "server_stopped",
      ]
    ) {
      assert.ok(names.includes(name), name);
    }
    const finished = lines.find((l) =>
      l.event === "request_finished" && l.request_id === requestId
    );
    assert.equal(finished.finish_reason, "completed");
    assert.equal(finished.http_status, 200);
    const accepted = lines.find((l) => l.event === "request_accepted");
    assert.equal(accepted.program, `${requestId}.json`);
    assert.deepEqual(accepted.ops, { upload: 1, get_function: 1, run: 1, return: 1 });
    assert.deepEqual(
      JSON.parse(Deno.readTextFileSync(`${runDir}/programs/${requestId}.json`)),
      program,
    );
    // Console mirror: "<ts> <LEVEL padded to 7> <event> key=value ...", without config.
    const ready = console.find((l) => l.includes(" pool_ready "));
    assert.match(ready!, /^\S+Z INFO {4}pool_ready sandbox=none mode=cpu /);
    const started = console.find((l) => l.includes(" server_started "))!;
    assert.equal(started.includes("config="), false);
  } finally {
    await Deno.remove(logDir, { recursive: true });
  }
});

Deno.test("events: --no-log-programs and --no-log-console; no log dir writes nothing", async () => {
  const logDir = await Deno.makeTempDir();
  const console: string[] = [];
  const log = new EventLog({
    logDir,
    console: false,
    programs: false,
    consoleWrite: (line) => console.push(line),
  });
  log.emit("INFO", "something", { a: 1 });
  assert.equal(log.saveProgram("id", new TextEncoder().encode("{}")), null);
  log.close();
  assert.deepEqual(console, []);
  const runDir = log.runDir!;
  assert.deepEqual([...Deno.readDirSync(runDir)].map((e) => e.name).sort(), [
    "events.jsonl",
    "output",
  ]);
  const off = new EventLog({ logDir: null, console: false, programs: true });
  off.emit("INFO", "nothing");
  assert.equal(off.runDir, null);
  assert.equal(off.saveProgram("id", new Uint8Array()), null);
  await Deno.remove(logDir, { recursive: true });
});

Deno.test("events: a second start in the same instant gets a suffixed run directory", async () => {
  const logDir = await Deno.makeTempDir();
  const logs = Array.from(
    { length: 3 },
    () => new EventLog({ logDir, console: false, programs: true }),
  );
  const names = logs.map((l) => l.runDir!.split("/").at(-1)!);
  assert.equal(new Set(names).size, 3);
  for (const l of logs) l.close();
  await Deno.remove(logDir, { recursive: true });
});

Deno.test("events: console values are cut at 120 characters and floats get one decimal", () => {
  const { log, console } = consoleOnlyLog();
  log.emit("WARNING", "x", { long: "y".repeat(200), ms: 1.2345, skip: null, traceback: "t" });
  assert.match(console[0], / WARNING x long=y{120}\.\.\. ms=1\.2$/);
});

Deno.test("events: batched console lines wait for one write, keep their order, and go out at close", async () => {
  const { log, console } = consoleOnlyLog({
    consoleBatched: ["request_finished"],
    consoleBatchMs: 10,
  });
  const seen: string[] = [];
  log.subscribe((record) => seen.push(String(record.request_id ?? record.event)));
  log.emit("INFO", "request_finished", { request_id: "r1" });
  log.emit("WARNING", "request_finished", { request_id: "r2" });
  // Listeners see each event at once; the console gets the lines later.
  assert.deepEqual(seen, ["r1", "r2"]);
  assert.deepEqual(console, []);
  // Another event writes the gathered lines first: the console keeps the events' order.
  log.emit("INFO", "node_ready", { node: "gpu-a" });
  assert.equal(console.length, 3);
  assert.match(console[0], /^\S+Z INFO {4}request_finished request_id=r1$/);
  assert.match(console[1], /^\S+Z WARNING request_finished request_id=r2$/);
  assert.match(console[2], / node_ready node=gpu-a$/);
  // The timer writes what is gathered after it.
  log.emit("INFO", "request_finished", { request_id: "r3" });
  assert.equal(console.length, 3);
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.equal(console.length, 4);
  assert.match(console[3], /request_id=r3$/);
  // Close writes what is left.
  log.emit("INFO", "request_finished", { request_id: "r4" });
  log.close();
  assert.equal(console.length, 5);
  assert.match(console[4], /request_id=r4$/);
});

Deno.test("events: batched lines reach stderr before the process exits", async () => {
  const script = `
    import { EventLog } from ${JSON.stringify(new URL("../http/events.ts", import.meta.url).href)};
    const log = new EventLog({
      logDir: null, console: true, programs: false, consoleBatched: ["request_finished"],
      consoleBatchMs: 60_000,
    });
    for (let i = 0; i < 3; i++) log.emit("INFO", "request_finished", { request_id: "r" + i });
  `;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.equal(output.code, 0);
  const lines = new TextDecoder().decode(output.stderr).trim().split("\n");
  assert.deepEqual(lines.map((l) => l.split(" ").at(-1)), [
    "request_id=r0",
    "request_id=r1",
    "request_id=r2",
  ]);
});

Deno.test("events: isoNow is the ISO time of Date.now, whatever the day and the millisecond", () => {
  const realNow = Date.now;
  try {
    for (
      const base of [
        0,
        86_399_999,
        1_700_000_000_000,
        1_798_000_000_123,
        253_402_300_799_000,
        -1000,
      ]
    ) {
      for (let step = 0; step < 400; step++) {
        const ms = base + step * 997;
        Date.now = () => ms;
        assert.equal(isoNow(), new Date(ms).toISOString());
        assert.equal(isoNow(), new Date(ms).toISOString(), "the same millisecond again");
      }
    }
  } finally {
    Date.now = realNow;
  }
});
