import {
  DescendantsSurvivedError,
  enableChildSubreaper,
  ProcessTree,
  TREE_MARKER_VARIABLE,
} from "./process_tree.ts";

Deno.test("process tree: TREE_MARKER_VARIABLE", async () => {
  const tree = ProcessTree.spawn(
    { command: "sh", args: ["-c", `test -n "$${TREE_MARKER_VARIABLE}"`], env: {} },
  );
  if ((await tree.exited).code !== 0) throw new Error("no marker");
  await tree.cleanup();
});

Deno.test("process tree: DescendantsSurvivedError", () => {
  const error = new DescendantsSurvivedError([41, 42]);
  if (error.pids.length !== 2 || error.name !== "DescendantsSurvivedError") throw new Error();
});

Deno.test("process tree: enableChildSubreaper", () => {
  const state = enableChildSubreaper();
  if (state.enabled !== (state.reason === "")) throw new Error();
});

Deno.test("process tree: ProcessTree", async () => {
  const tree = ProcessTree.spawn({ command: "sh", args: ["-c", "exit 3"], env: {} });
  const status = await tree.exited;
  await tree.cleanup();
  if (status.code !== 3) throw new Error();
});
