import { checkPathConflicts, normalizeFilePath, PathError } from "./mod.ts";

Deno.test("paths: normalizeFilePath", () => {
  if (normalizeFilePath("./data//x.bin") !== "data/x.bin") throw new Error();
});

Deno.test("paths: checkPathConflicts", () => {
  checkPathConflicts(["a-b", "a/c"]); // fine
  try {
    checkPathConflicts(["a/b", "a-b", "a"]);
    throw new Error("expected a conflict");
  } catch (error) {
    if (!(error instanceof PathError)) throw error;
  }
});
