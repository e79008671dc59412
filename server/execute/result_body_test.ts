// Building a response from a worker's outcome (server/execute/result_body.ts): the files it uses,
// and that nothing of them is left however the body ends.
import assert from "node:assert/strict";
import { buildResultBody as buildResponse, crashError, crashResultBody } from "./result_body.ts";
import type { WorkerOutcome } from "../workers/worker_protocol.ts";

const _META = { requestId: "r", queueMs: 0, elapsedMs: 0, leaseWaitMs: 0, leaseHeldMs: 0 };

/** Open descriptors of this process on files under `dir` (other tests in the process aside). */
function _openUnder(dir: string): number {
  let count = 0;
  for (const entry of Deno.readDirSync("/proc/self/fd")) {
    try {
      if (Deno.readLinkSync(`/proc/self/fd/${entry.name}`).startsWith(dir + "/")) count++;
    } catch {
      // closed meanwhile
    }
  }
  return count;
}

/** A results directory with `count` parts of `size` bytes, and the outcome naming them. */
async function _outcome(count: number, size: number, boundary = "kcoral-b") {
  const dir = await Deno.makeTempDir();
  const parts = [];
  for (let i = 0; i < count; i++) {
    const path = `${dir}/part-${i}`;
    await Deno.writeFile(path, new Uint8Array(size).fill(i + 1));
    parts.push({ path, size, sha256: "0".repeat(64) });
  }
  const outcome: WorkerOutcome = {
    status: "COMPLETED",
    results: "{}",
    error: null,
    parts,
    stdout: null,
    stderr: null,
    boundary,
  };
  return { dir, outcome };
}

Deno.test("response: a streamed body cancelled at any point leaves no open file and no staging", async () => {
  for (const reads of [0, 1, 3]) { // before its first read; inside the first part; later
    const { dir, outcome } = await _outcome(3, 3 << 20);
    const staging = `${dir}-staging`;
    try {
      const built = await buildResponse(outcome, _META, 0, 1 << 30, staging);
      assert.equal(built.kind, "ok");
      assert.equal(_openUnder(staging), 3); // the three parts, open until sent
      const body = (built as { body: ReadableStream<Uint8Array> }).body;
      const reader = body.getReader();
      for (let i = 0; i < reads; i++) await reader.read();
      await reader.cancel();
      assert.equal(_openUnder(staging), 0, `files left open after ${reads} reads`);
      assert.equal(await Deno.stat(staging).catch(() => null), null, `staging left (${reads})`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("response: without a boundary from the worker a new one is chosen; every part is taken", async () => {
  // No boundary from the worker: the parts are read to pick one, after they were moved.
  const { dir, outcome } = await _outcome(2, 2 << 20, "");
  const staging = `${dir}-staging`;
  try {
    const built = await buildResponse(outcome, _META, 0, 1 << 30, staging);
    assert.equal(built.kind, "ok");
    assert.deepEqual([...Deno.readDirSync(dir)], []); // both parts were taken before any read
    const bytes = new Uint8Array(
      await new Response((built as { body: BodyInit }).body).arrayBuffer(),
    );
    assert.equal(bytes.length, (built as { bytes: number }).bytes);
    assert.equal(await Deno.stat(staging).catch(() => null), null);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("response: a file the worker reported but did not leave fails the answer, and no staging stays", async () => {
  const { dir, outcome } = await _outcome(1, 3 << 20);
  await Deno.writeTextFile(`${dir}/stderr`, "a line\n");
  outcome.stdout = { path: `${dir}/stdout`, size: 5 }; // never written
  outcome.stderr = { path: `${dir}/stderr`, size: 7 };
  const staging = `${dir}-staging`;
  try {
    await assert.rejects(
      buildResponse(outcome, _META, 1024, 1 << 30, staging),
      /worker result .*stdout cannot be taken/,
    );
    assert.equal(await Deno.stat(staging).catch(() => null), null);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("crash body: a FAILED runtime error naming the instruction, no traceback", () => {
  const error = crashError(2, { op: "run", id: "boom" });
  assert.equal(error.instruction_index, 2);
  assert.equal(error.traceback, "");
  const body = crashResultBody(
    { requestId: "r", queueMs: 0, elapsedMs: 1, leaseWaitMs: 0, leaseHeldMs: 0 },
    error,
  );
  assert.equal(JSON.parse(body).error.instruction_id, "boom");
});
