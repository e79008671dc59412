/**
 * The worker frames: the types declared in server/workers/worker_protocol.ts are exactly those of
 * the tables in docs/architecture.md §3.1 (runtime_py/tests/test_frames.py checks the Python
 * side against the same tables), every report type survives encoding, framing and parsing whole, and
 * a report of the wrong shape is refused.
 */
import assert from "node:assert/strict";
import { encodeFrame, type Frame, readFrames } from "./ipc.ts";
import {
  FRAME_TYPES,
  FrameShapeError,
  parseChildReport,
  parseZygoteReport,
} from "./worker_protocol.ts";

/** The frame types of each table of docs/architecture.md §3.1, by the line before it. */
function documentedTypes(): Record<string, string[]> {
  const doc = Deno.readTextFileSync(new URL("../../docs/architecture.md", import.meta.url));
  const tables: Record<string, string[]> = {};
  let current: string | null = null;
  for (const line of doc.split("\n")) {
    const heading = line.match(/^(Server → zygote|Server → child|Zygote → server|Child → server)/);
    if (heading) {
      current = heading[1];
      tables[current] = [];
      continue;
    }
    const row = line.match(/^\| `\{"t":"([a-z_]+)"/);
    if (row && current) {
      if (!tables[current].includes(row[1])) tables[current].push(row[1]);
    } else if (current && line.trim() !== "" && !line.startsWith("|")) {
      current = null;
    }
  }
  return tables;
}

Deno.test("worker frames: the declared types are the documented ones", () => {
  const doc = documentedTypes();
  assert.deepEqual(doc["Server → zygote"], [...FRAME_TYPES.zygoteCommands]);
  assert.deepEqual(doc["Server → child"], [...FRAME_TYPES.childCommands]);
  assert.deepEqual(doc["Zygote → server"], [...FRAME_TYPES.zygoteReports]);
  assert.deepEqual(doc["Child → server"], [...FRAME_TYPES.childReports]);
});

const REPORTS: { zygote: Frame[]; child: Frame[] } = {
  zygote: [
    {
      t: "hello",
      pid: 7,
      python: "3.11.7",
      versions: { torch: "2.11" },
      mode: "gpu",
      monotonic_ns: 123456789,
    },
    { t: "forked", c: 1, pid: 8, monotonic_ns: 123 },
    { t: "exited", c: 1, code: null, signal: 9, orphans: false },
    { t: "exited", c: 1, code: 7, signal: null, orphans: false, instr: 2 },
    { t: "error", message: "zygote startup failed" },
  ],
  child: [
    { t: "ready", c: 1, target: { arch: "sm_90a" }, versions: {}, device_uuids: ["GPU-x"] },
    {
      t: "ready",
      c: 2,
      target: { arch: "sm_90a" },
      versions: {},
      device_uuids: ["GPU-x"],
      context: "deferred",
    },
    { t: "init_failed", c: 1, message: "RuntimeError: no device", traceback: "..." },
    { t: "instr", c: 1, i: 3 },
    { t: "lease", c: 1, a: "acquire" },
    { t: "lease", c: 1, a: "release" },
    {
      t: "outcome",
      c: 1,
      outcome: {
        status: "FAILED",
        results: "{}",
        error: { kind: "engine" },
        parts: [{ path: "/r/p0", size: 4, sha256: "a".repeat(64) }],
        stdout: { path: "/r/stdout", size: 2 },
        stderr: null,
        gpu_access: null,
        boundary: "kcoral-0",
      },
      retire: "request_limit",
    },
    { t: "clean", c: 1, retire: null },
  ],
};

async function roundTrip(frames: Frame[]): Promise<Frame[]> {
  const bytes = frames.map((f) => encodeFrame(f));
  const stream = ReadableStream.from(bytes);
  const out: Frame[] = [];
  for await (const frame of readFrames(stream)) out.push(frame);
  return out;
}

Deno.test("worker frames: every report survives encoding, framing and parsing", async () => {
  const zygote = await roundTrip(REPORTS.zygote);
  assert.deepEqual(zygote.map((f) => parseZygoteReport(f)), REPORTS.zygote);
  const child = await roundTrip(REPORTS.child.map((f) => ({ ...f, child: true })));
  assert.deepEqual(
    child.map((f) => parseChildReport(f)),
    REPORTS.child.map((f) => ({ ...f, child: true })),
  );
  const types = new Set([...REPORTS.zygote, ...REPORTS.child].map((f) => f.t));
  for (const t of [...FRAME_TYPES.zygoteReports, ...FRAME_TYPES.childReports]) {
    assert.ok(types.has(t), `no example of '${t}'`);
  }
});

Deno.test("worker frames: reports of the wrong shape are refused", () => {
  const bad: [(f: Frame) => unknown, Frame][] = [
    [parseZygoteReport, { t: "forked", c: 1, pid: "2" }],
    [parseZygoteReport, { t: "exited", c: 1, code: "0", signal: null, orphans: false }],
    [parseZygoteReport, { t: "exited", c: 1, code: 1, signal: null, orphans: false, instr: -1 }],
    [parseZygoteReport, { t: "exited", c: 1, code: 1, signal: null, orphans: false, instr: "2" }],
    [parseZygoteReport, { t: "ready", c: 1 }], // a child's frame is not the zygote's
    [parseChildReport, { t: "instr", c: 1 }],
    [
      parseChildReport,
      { t: "ready", c: 1, target: {}, versions: {}, device_uuids: [], context: "later" },
    ],
    [parseChildReport, { t: "lease", c: 1, a: "steal" }],
    [parseChildReport, { t: "outcome", c: 1, outcome: { status: "DONE" }, retire: null }],
    [parseChildReport, { t: "hello", pid: 1 }],
  ];
  for (const [parse, frame] of bad) {
    assert.throws(() => parse(frame), FrameShapeError, JSON.stringify(frame));
  }
});
