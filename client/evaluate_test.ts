/**
 * Unit tests of evaluateKernel's data handling with a stand-in server: the bundles a step
 * returns go to the next steps as the very arrays the responses decoded, under the digests they
 * were verified against (no copy, no second hash).
 */
import assert from "node:assert/strict";
import { type EvaluateClient, evaluateKernel } from "./evaluate.ts";
import type { Program } from "./program.ts";
import { ProgramResult, RESULT_FACTORIES, type ResultValue } from "./result.ts";
import { KeptReturn } from "./kept_return.ts";
import { BlobsNotHeldError } from "./errors.ts";

function answer(value: ResultValue): ProgramResult {
  return new ProgramResult({
    status: "COMPLETED",
    requestId: `r${Math.random()}`,
    queueMs: 0,
    elapsedMs: 1,
    leaseWaitMs: 0,
    leaseHeldMs: 0,
    results: new Map([["out", value]]),
    stdout: "",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    error: null,
    gpuIds: [],
  });
}

/** Answers the three steps as a server would, keeping the programs it was sent. */
class StandIn implements EvaluateClient {
  readonly sent = new Map<string, Program>();
  // Digests the "responses" were verified against: not these bytes' real SHA-256, so a blob
  // named by one of them was never hashed by the client.
  readonly inputsDigest = "a".repeat(64);
  readonly outputsDigest = "b".repeat(64);
  readonly inputs = new Uint8Array(64).fill(1);
  readonly outputs = new Uint8Array(32).fill(2);

  execute(program: Program): Promise<ProgramResult> {
    const json = program.toJson();
    const step = ["generate_inputs", "run_candidate", "judge"].find((name) =>
      json.includes(`import ${name}\\n`)
    )!;
    this.sent.set(step, program);
    if (step === "generate_inputs") {
      return Promise.resolve(answer(RESULT_FACTORIES.bytes(this.inputs, this.inputsDigest)));
    }
    if (step === "run_candidate") {
      return Promise.resolve(answer(RESULT_FACTORIES.bytes(this.outputs, this.outputsDigest)));
    }
    return Promise.resolve(answer(JSON.stringify({ correct: true, flags: [] })));
  }
}

Deno.test("evaluateKernel hands each returned bundle on as decoded: same array, verified digest", async () => {
  const server = new StandIn();
  const verdict = await evaluateKernel(server, { reference: "ref", candidate: "cand" });
  assert.equal(verdict.correct, true);
  const candidate = server.sent.get("run_candidate")!;
  const judge = server.sent.get("judge")!;
  assert.equal(candidate.blobs.get(server.inputsDigest), server.inputs);
  assert.equal(judge.blobs.get(server.inputsDigest), server.inputs);
  assert.equal(judge.blobs.get(server.outputsDigest), server.outputs);
  assert.equal(candidate.blobs.size, 1);
  assert.equal(judge.blobs.size, 2);
});

Deno.test("evaluateKernel hashes a bundle whose digest no response gave", async () => {
  const server = new StandIn();
  // A stand-in that returns plain arrays (not decoded by RESULT_FACTORIES).
  server.execute = (program: Program) => {
    const json = program.toJson();
    server.sent.set(json.includes("import judge\\n") ? "judge" : "other", program);
    const out: ResultValue = json.includes("import generate_inputs\\n")
      ? server.inputs
      : json.includes("import run_candidate\\n")
      ? server.outputs
      : JSON.stringify({ correct: true, flags: [] });
    return Promise.resolve(answer(out));
  };
  await evaluateKernel(server, { reference: "ref", candidate: "cand" });
  const judge = server.sent.get("judge")!;
  const digest = Array.from(
    new Uint8Array(await crypto.subtle.digest("SHA-256", server.inputs)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  assert.equal(judge.blobs.get(digest), server.inputs);
});

/** A server that keeps returns: bundles come back as KeptReturns, step 1's with its header digest. */
class KeepingStandIn implements EvaluateClient {
  readonly sent: { step: string; program: Program; options: Record<string, unknown> }[] = [];
  readonly inputs = new KeptReturn({ kind: "bytes", sha256: "c".repeat(64), size: 1 << 30 });
  readonly outputs = new KeptReturn({ kind: "bytes", sha256: "d".repeat(64), size: 1 << 29 });
  /** Candidate steps that find the kept inputs gone (the first `gone` of them). */
  gone = 0;

  execute(program: Program, options: Record<string, unknown> = {}): Promise<ProgramResult> {
    const json = program.toJson();
    const step = ["generate_inputs", "run_candidate", "judge"].find((name) =>
      json.includes(`import ${name}\\n`)
    )!;
    this.sent.push({ step, program, options });
    const keeps = options.keepReturns !== undefined;
    if (step === "generate_inputs") {
      const asked = json.includes('\\"header_digest\\":true');
      const bytes = new Uint8Array(64).fill(1);
      return Promise.resolve(
        answer(asked ? [keeps ? this.inputs : bytes, "e".repeat(64)] : bytes),
      );
    }
    if (step === "run_candidate") {
      if (keeps && this.gone-- > 0) {
        return Promise.reject(
          new BlobsNotHeldError(
            ["c".repeat(64)],
            `server misses blobs with no local bytes to send: ['${"c".repeat(64)}']`,
          ),
        );
      }
      return Promise.resolve(answer(keeps ? this.outputs : new Uint8Array(32).fill(2)));
    }
    return Promise.resolve(answer(JSON.stringify({ correct: true, flags: [] })));
  }
}

Deno.test("evaluateKernel leaves kept bundles on the server: programs name them, send no bytes", async () => {
  const server = new KeepingStandIn();
  await evaluateKernel(server, { reference: "ref", candidate: "cand" });
  const [inputs, candidate, judge] = server.sent;
  assert.deepEqual(server.sent.map((s) => s.step), ["generate_inputs", "run_candidate", "judge"]);
  assert.equal(inputs.options.keepReturns, 1 << 20);
  assert.equal(candidate.options.keepReturns, 1 << 20);
  assert.equal(candidate.program.blobs.size, 0);
  assert.equal(judge.program.blobs.size, 0);
  const named = (p: Program) => p.instructions.filter((i) => i.op === "upload").map((i) => i.blob);
  assert.ok(named(candidate.program).includes(server.inputs.sha256));
  assert.ok(named(judge.program).includes(server.inputs.sha256));
  assert.ok(named(judge.program).includes(server.outputs.sha256));
  // The judge checks the inputs against the header digest step 1 stated.
  assert.match(judge.program.toJson(), /inputs_header_sha256\\":\\"e{64}/);
});

Deno.test("evaluateKernel starts again carrying the bundles when a kept one is gone", async () => {
  const server = new KeepingStandIn();
  server.gone = 1;
  const verdict = await evaluateKernel(server, { reference: "ref", candidate: "cand" });
  assert.equal(verdict.correct, true);
  const steps = server.sent.map((s) => `${s.step}${s.options.keepReturns ? "+keep" : ""}`);
  assert.deepEqual(steps, [
    "generate_inputs+keep",
    "run_candidate+keep",
    "generate_inputs",
    "run_candidate",
    "judge",
  ]);
  assert.equal(server.sent[3].program.blobs.size, 1); // the inputs, carried
  // New secret seeds for the second round.
  const seeds = (p: Program) => JSON.stringify(p.instructions.at(-2));
  assert.notEqual(seeds(server.sent[0].program), seeds(server.sent[2].program));
});
