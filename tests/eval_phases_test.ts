/**
 * `kcoral eval`'s `phases_ms` account for the whole `total` for every kind of verdict: correct,
 * incorrect, a candidate whose worker died (`os._exit` inside `forward`: a 200 FAILED step with
 * no phase times) and one past its deadline (a 504 step: no timings at all), against a live CPU
 * server with CPU torch (docs/eval.md, "phases_ms").
 */
import assert from "node:assert/strict";
import { Client, type Verdict } from "../client/mod.ts";
import { startServer } from "./_server.ts";

const FIXTURES = new URL("./fixtures/eval/", import.meta.url).pathname;
const source = (name: string) => Deno.readTextFileSync(`${FIXTURES}${name}`);

/** The phases other than the two totals add up to `total` (each is rounded to 1 µs). */
function assertPhasesAddUp(verdict: Verdict, label: string): void {
  const { total, total_excluding_compile, ...parts } = verdict.phases_ms;
  const sum = Object.values(parts).reduce((t, ms) => t + ms, 0);
  assert.ok(Math.abs(sum - total) < 0.01, `${label}: phases ${sum} ms, total ${total} ms`);
  for (const [key, ms] of Object.entries(parts)) assert.ok(ms >= 0, `${label}: ${key} ${ms}`);
  assert.ok(Math.abs(total - total_excluding_compile - parts.candidate_load) < 0.01, label);
}

Deno.test({
  name: "eval phases: correct, incorrect, crashed and timed-out verdicts account for the total",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const server = await startServer({ numWorkers: 2 });
    try {
      await using client = new Client(server.url);
      const reference = source("scale_add_reference.py");
      const evaluate = (candidate: string, timeoutSeconds?: number) =>
        client.evaluate({
          reference,
          candidate,
          timing: { warmup: 1, repeat: 6 },
          ...(timeoutSeconds === undefined ? {} : { timeoutSeconds }),
        });

      const correct = await evaluate(source("scale_add_honest.py"));
      assert.equal(correct.correct, true);
      assertPhasesAddUp(correct, "correct");
      assert.equal(correct.phases_ms.candidate_unfinished, 0);

      const incorrect = await evaluate(source("scale_add_wrong.py"));
      assert.equal(incorrect.correct, false);
      assert.equal(incorrect.error, undefined);
      assertPhasesAddUp(incorrect, "incorrect");
      assert.equal(incorrect.phases_ms.candidate_unfinished, 0);

      // The worker dies inside forward: the step's time on the worker is the candidate's, not
      // the workers' start.
      const crashed = await evaluate(source("scale_add_exits.py"));
      assert.equal(crashed.error?.phase, "candidate");
      assertPhasesAddUp(crashed, "crashed");
      assert.ok(crashed.phases_ms.candidate_unfinished > 0, "the dead worker's time is named");
      assert.equal(crashed.phases_ms.candidate_correctness, 0);

      // Past its deadline (504): the whole step, which came back without timings.
      const hung = await evaluate(source("scale_add_hangs.py"), 8);
      assert.equal(hung.error?.type, "timeout");
      assertPhasesAddUp(hung, "timed out");
      assert.ok(
        hung.phases_ms.candidate_unfinished >= 8000,
        `${hung.phases_ms.candidate_unfinished}`,
      );
    } finally {
      await server.stop();
    }
  },
});
