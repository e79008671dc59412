/**
 * The run state machine (`runProgram`) with a fake child: lease service, the deadline that
 * pauses while the child waits for the lease, timeouts killed under the lease, crashes, invalid
 * frames, retiring children, hygiene after the answer, and complete lease timings.
 */
import assert from "node:assert/strict";
import { type RunParams, runProgram } from "./execution.ts";
import type { ChildChannel, ChildExit } from "../workers/worker_handles.ts";
import type { Frame } from "../workers/ipc.ts";
import { GpuLeases } from "../workers/lease.ts";
import type { ChildCommand, WorkerOutcome } from "../workers/worker_protocol.ts";

const OUTCOME: WorkerOutcome = {
  status: "COMPLETED",
  results: "{}",
  error: null,
  parts: [],
  stdout: null,
  stderr: null,
};
const EXIT: ChildExit = { code: 0, signal: null, orphans: false, slotDied: false };

/** A child driven by `script`, which sees every frame sent to it and may answer. */
class FakeChild implements ChildChannel {
  readonly sent: ChildCommand[] = [];
  readonly tails: (Uint8Array | undefined)[] = [];
  readonly exited: Promise<ChildExit>;
  killed = 0;
  #handler: ((frame: Frame) => void) | null = null;
  #exit!: (exit: ChildExit) => void;
  #script: (frame: ChildCommand, child: FakeChild) => void;

  constructor(script: (frame: ChildCommand, child: FakeChild) => void) {
    this.#script = script;
    this.exited = new Promise((resolve) => (this.#exit = resolve));
  }

  /** The child says `frame` (as its zygote relays it). */
  say(frame: { t: string; [key: string]: unknown }): void {
    this.#handler?.({ c: 1, child: true, ...frame } as Frame);
  }

  /** The child (and its tree) is gone. */
  die(exit: ChildExit = EXIT): void {
    this.#exit(exit);
  }

  send(frame: ChildCommand, tail?: Uint8Array): void {
    this.sent.push(frame);
    this.tails.push(tail);
    queueMicrotask(() => this.#script(frame, this));
  }
  setHandler(handler: ((frame: Frame) => void) | null): void {
    this.#handler = handler;
  }
  watchExit(): { exited: Promise<ChildExit>; stop: () => void } {
    return { exited: this.exited, stop: () => {} };
  }
  kill(): Promise<ChildExit> {
    this.killed++;
    this.die({ code: null, signal: 9, orphans: false, slotDied: false });
    return this.exited;
  }
  destroySlot(): Promise<void> {
    this.die({ code: null, signal: 9, orphans: false, slotDied: true });
    return Promise.resolve();
  }
}

/** A child that asks for the lease on `run` and, once granted, answers with hygiene to follow. */
function answersBeforeHygiene(): FakeChild {
  return new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "lease", a: "acquire" });
    else if (frame.t === "lease") {
      c.say({ t: "outcome", outcome: OUTCOME, retire: null, cleanup: true });
    }
  });
}

function params(child: FakeChild, extra: Partial<RunParams> = {}): RunParams {
  return {
    child,
    leases: null,
    gpus: [],
    holder: { id: "r1" },
    timeoutMs: 2000,
    graceSeconds: 1,
    request: {
      request_id: "r1",
      program: new TextEncoder().encode("{}"),
      blobs: {},
      workspace: "/w",
      results: "/r",
      output_limit_bytes: 0,
      max_return_bytes: 1 << 20,
      sandbox: false,
    },
    ...extra,
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

Deno.test("run: a CPU child answers; no lease, lease times 0", async () => {
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") {
      c.say({ t: "lease", a: "acquire" }); // a CPU child asks anyway: granted at once
    } else if (frame.t === "lease") {
      c.say({ t: "outcome", outcome: OUTCOME, retire: null });
    }
  });
  const run = await runProgram(params(child));
  assert.equal(run.end.kind, "outcome");
  assert.equal(run.leaseHeldMs, 0);
  assert.equal(run.leaseWaitMs, 0);
  assert.deepEqual(child.sent.map((f) => f.t), ["run", "lease"]);
  // The program goes as the run frame's tail, its own bytes, not a member of the JSON.
  assert.equal(new TextDecoder().decode(child.tails[0]), "{}");
  assert.ok(!("program" in (child.sent[0] as { req: object }).req));
  assert.equal(child.tails[1], undefined);
});

Deno.test("run: the deadline pauses while the child waits for the lease", async () => {
  const leases = new GpuLeases([0]);
  const other = { id: "other" };
  await leases.acquire(other, [0]);
  let askedAt = NaN;
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") {
      c.say({ t: "lease", a: "acquire" }); // the run starts waiting before this returns
      askedAt = performance.now();
    } else if (frame.t === "lease") c.say({ t: "outcome", outcome: OUTCOME, retire: null });
  });
  const before = performance.now();
  const running = runProgram(params(child, { leases, gpus: [0], timeoutMs: 80 }));
  await sleep(250); // longer than the whole budget, all of it waiting for the lease
  const releasedAt = performance.now();
  leases.release(other);
  const run = await running;
  const after = performance.now();
  assert.equal(run.end.kind, "outcome", JSON.stringify(run.end));
  assert.equal(child.killed, 0);
  assert.deepEqual(child.sent.map((f) => f.t), ["run", "lease"], "granted, then the outcome");
  // The wait counted covers the ask to the release, and lies within the run.
  assert.ok(
    releasedAt - askedAt <= run.leaseWaitMs && run.leaseWaitMs <= after - before,
    `waited ${run.leaseWaitMs}: asked ${askedAt}, released ${releasedAt}, run ${before}..${after}`,
  );
});

Deno.test("run: a timeout kills under the lease, then releases it", async () => {
  const leases = new GpuLeases([0]);
  const child = new FakeChild(() => {}); // never answers
  const run = await runProgram(params(child, { leases, gpus: [0], timeoutMs: 30 }));
  assert.equal(run.end.kind, "timeout");
  assert.equal(child.killed, 1);
  assert.equal(leases.holderAt([0], performance.now(), { id: "x" }), null);
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "the lease is free again");
});

Deno.test("run: a child that dies is a crash attributed to its last instruction", async () => {
  const child = new FakeChild((frame, c) => {
    if (frame.t !== "run") return;
    c.say({ t: "instr", i: 0 });
    c.say({ t: "instr", i: 2 });
    c.die({ code: 1, signal: null, orphans: false, slotDied: false });
  });
  const run = await runProgram(params(child));
  assert.equal(run.end.kind, "crashed");
  assert.equal(run.end.kind === "crashed" && run.end.instructionIndex, 2);
});

Deno.test("run: a crash is attributed to the instruction its exit names", async () => {
  const child = new FakeChild((frame, c) => {
    if (frame.t !== "run") return;
    c.say({ t: "instr", i: 0 }); // a frame, then the page the zygote read: the page wins
    c.die({ code: 7, signal: null, orphans: false, slotDied: false, instruction: 3 });
  });
  const run = await runProgram(params(child));
  assert.equal(run.end.kind === "crashed" && run.end.instructionIndex, 3);
});

Deno.test("run: a worker that dies holding the lease is read by the server before it is let go", async () => {
  const leases = new GpuLeases([0]);
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "lease", a: "acquire" });
    else if (frame.t === "lease") c.die({ code: 3, signal: null, orphans: false, slotDied: false });
  });
  let heldWhileRead: boolean | null = null;
  const run = await runProgram(params(child, {
    leases,
    gpus: [0],
    readGpus: () => {
      heldWhileRead = !leases.tryAcquire({ id: "probe" }, [0]);
      return Promise.resolve({ report: { read: true } });
    },
  }));
  assert.equal(run.end.kind, "crashed");
  assert.equal(heldWhileRead, true, "read under the request's lease");
  assert.deepEqual(run.serverReading, { report: { read: true } });
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "the lease is free again");
});

Deno.test("run: no server reading for a run that never held the lease, or that sent a receipt", async () => {
  const leases = new GpuLeases([0]);
  let reads = 0;
  const readGpus = () => (reads++, Promise.resolve({ report: {} }));
  const dies = new FakeChild((frame, c) => {
    if (frame.t === "run") c.die({ code: 3, signal: null, orphans: false, slotDied: false });
  });
  const crashed = await runProgram(params(dies, { leases, gpus: [0], readGpus }));
  assert.equal(crashed.end.kind, "crashed");
  assert.equal(crashed.serverReading, null);
  const receipted = new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "lease", a: "acquire" });
    else if (frame.t === "lease") {
      c.say({ t: "outcome", outcome: { ...OUTCOME, gpu_receipt: { gpus: [] } }, retire: null });
    }
  });
  const answered = await runProgram(params(receipted, { leases, gpus: [0], readGpus }));
  assert.equal(answered.end.kind, "outcome");
  assert.equal(answered.serverReading, null);
  assert.equal(reads, 0);
});

Deno.test("run: a frame of the wrong shape is an invalid answer, and the child is killed", async () => {
  for (const frame of [{ t: "bogus" }, { t: "instr", i: "two" }, { t: "outcome", outcome: 3 }]) {
    const child = new FakeChild((f, c) => {
      if (f.t === "run") c.say(frame);
    });
    const run = await runProgram(params(child));
    assert.equal(run.end.kind, "invalid", JSON.stringify(frame));
    assert.equal(child.killed, 1);
  }
});

/** A child that takes the lease, then answers and retires (request limit reached). */
function _retiringChild(): FakeChild {
  return new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "lease", a: "acquire" });
    else if (frame.t === "lease") {
      c.say({ t: "outcome", outcome: OUTCOME, retire: "request_limit" });
    }
  });
}

Deno.test("run: a retiring child keeps the lease through its teardown", async () => {
  const leases = new GpuLeases([0]);
  const child = _retiringChild();
  const run = await runProgram(params(child, { leases, gpus: [0] }));
  assert.equal(run.end.kind === "outcome" && run.end.retire, "request_limit");
  assert.equal(leases.tryAcquire({ id: "next" }, [0]), false, "held while it tears down");
  child.die();
  await run.teardown;
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "released once it is gone");
});

Deno.test("run: a retiring child still there after the grace is killed; the lease comes back", async () => {
  const leases = new GpuLeases([0]);
  const child = _retiringChild(); // and it never exits by itself (outlived its answer)
  const run = await runProgram(params(child, { leases, gpus: [0], graceSeconds: 1 }));
  await sleep(500);
  assert.equal(child.killed, 0, "not before the grace");
  assert.equal(leases.tryAcquire({ id: "next" }, [0]), false, "held while it tears down");
  await run.teardown;
  assert.equal(child.killed, 1);
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "released once it is gone");
});

Deno.test("run: hygiene after the answer keeps the lease until `clean`", async () => {
  const leases = new GpuLeases([0]);
  const child = answersBeforeHygiene();
  const run = await runProgram(params(child, { leases, gpus: [0] }));
  assert.ok(run.cleanup);
  assert.equal(leases.tryAcquire({ id: "next" }, [0]), false);
  child.say({ t: "clean", retire: null });
  assert.equal(await run.cleanup, null);
  assert.ok(leases.tryAcquire({ id: "next" }, [0]));
});

Deno.test("run: hygiene after the answer may give the lease back before `clean`", async () => {
  const leases = new GpuLeases([0]);
  const child = answersBeforeHygiene();
  const run = await runProgram(params(child, { leases, gpus: [0] }));
  assert.ok(run.cleanup);
  child.say({ t: "lease", a: "release" }); // after the answer: the host-only part follows
  const next = { id: "next" };
  assert.ok(leases.tryAcquire(next, [0]), "free while the child puts back host-only state");
  leases.release(next);
  child.say({ t: "clean", retire: null });
  assert.equal(await run.cleanup, null);
  assert.equal(child.killed, 0);
});

Deno.test("run: a child retiring in its hygiene takes the lease again and exits under it", async () => {
  const leases = new GpuLeases([0]);
  const other = { id: "other" };
  let granted = 0;
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "lease", a: "acquire" });
    else if (frame.t === "lease" && granted++ === 0) {
      c.say({ t: "outcome", outcome: OUTCOME, retire: null, cleanup: true });
    } else if (frame.t === "lease") {
      c.say({ t: "clean", retire: "process_state" }); // granted again: now it may exit
    }
  });
  const run = await runProgram(params(child, { leases, gpus: [0] }));
  child.say({ t: "lease", a: "release" }); // after the answer
  assert.ok(leases.tryAcquire(other, [0]));
  child.say({ t: "lease", a: "acquire" }); // waits behind `other`
  await sleep(20);
  assert.equal(granted, 1, "not granted while another holds the GPU");
  leases.release(other);
  await sleep(5);
  assert.equal(granted, 2);
  let settled = false;
  run.cleanup!.then(() => (settled = true));
  await sleep(5);
  assert.equal(settled, false, "waits for the exit");
  assert.equal(leases.tryAcquire({ id: "next" }, [0]), false, "held through the teardown");
  child.die();
  assert.equal(await run.cleanup, "process_state");
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "released once it is gone");
});

Deno.test("run: a child that overruns its hygiene without the lease is killed under it", async () => {
  const leases = new GpuLeases([0]);
  const child = answersBeforeHygiene();
  const run = await runProgram(params(child, { leases, gpus: [0], timeoutMs: 10 }));
  child.say({ t: "lease", a: "release" }); // after the answer; then never says `clean`
  const other = { id: "other" };
  assert.ok(leases.tryAcquire(other, [0]));
  let settled = false;
  run.cleanup!.then(() => (settled = true));
  await sleep(1100); // the hygiene's budget is at least 1 s
  assert.equal(child.killed, 0, "not killed while another request holds the GPU");
  leases.release(other);
  assert.equal(await run.cleanup, "timeout");
  assert.equal(child.killed, 1);
  assert.ok(settled);
  assert.ok(leases.tryAcquire({ id: "next" }, [0]));
});

Deno.test("run: a GPU set's wait and hold before the run count in its timings", async () => {
  const leases = new GpuLeases([0, 1]);
  const holder = { id: "set" };
  await leases.acquire(holder, [0, 1]);
  const heldSince = performance.now() - 40; // held (initializing its child) for 40 ms already
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "outcome", outcome: OUTCOME, retire: null });
  });
  const before = performance.now();
  const run = await runProgram(
    params(child, { leases, gpus: [0, 1], holder, heldSince, waitedMs: 7 }),
  );
  const after = performance.now();
  // Counted from `heldSince`, not from the run's start: the hold ends between the clock reads
  // around the run.
  assert.ok(
    before - heldSince <= run.leaseHeldMs && run.leaseHeldMs <= after - heldSince,
    `held ${run.leaseHeldMs} from ${heldSince}, run ${before}..${after}`,
  );
  assert.equal(run.leaseWaitMs, 7);
});

Deno.test("run: a free lease is granted with the program when its first step takes it", async () => {
  const leases = new GpuLeases([0]);
  const child = new FakeChild((frame, c) => {
    if (frame.t === "run") c.say({ t: "outcome", outcome: OUTCOME, retire: null });
  });
  const run = await runProgram(params(child, { leases, gpus: [0], leaseFirst: true }));
  assert.equal(run.end.kind, "outcome");
  const sent = child.sent[0];
  assert.equal(sent.t === "run" && sent.req.lease_held, true);
  assert.ok(leases.tryAcquire({ id: "next" }, [0]), "released with the answer");
});
