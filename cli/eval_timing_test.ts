import assert from "node:assert/strict";
import { evaluateTiming } from "./eval_timing.ts";

Deno.test("eval_timing: timing settings go as given, adaptive false included", () => {
  assert.deepEqual(evaluateTiming({}), {});
  assert.deepEqual(evaluateTiming({ repeat: 50 }), { repeat: 50 });
  // adaptive: false asks for a fixed count on a GPU (the runtime's default there is adaptive).
  assert.deepEqual(evaluateTiming({ adaptive: false }), { adaptive: false });
  assert.deepEqual(evaluateTiming({ warmup: 3, repeat: 20, adaptive: true }), {
    warmup: 3,
    repeat: 20,
    adaptive: true,
  });
});
