import assert from "node:assert/strict";
import { outputTail } from "./output_tail.ts";

Deno.test("outputTail: the end of a captured stream, tagged", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/stderr`, "fatal: simulated device-side assert\n");
  assert.equal(await outputTail(dir), "[err] fatal: simulated device-side assert\n");
  await Deno.remove(dir, { recursive: true });
});
