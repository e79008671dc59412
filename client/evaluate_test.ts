/**
 * Unit tests of evaluateKernel's data handling with a stand-in server: the bundles a step
 * returns go to the next steps as the very arrays the responses decoded, under the digests they
 * were verified against (no copy, no second hash).
 */
import assert from "node:assert/strict";
import { type EvaluateClient, evaluateKernel } from "./evaluate.ts";
import type { Program } from "./program.ts";
import { ProgramResult, RESULT_FACTORIES, type ResultValue } from "./result.ts";

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
