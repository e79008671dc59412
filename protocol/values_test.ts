import { validateManifest } from "./mod.ts";

Deno.test("values: validateManifest", () => {
  validateManifest(["a/x.txt", "b.txt"], ["a", "a/empty"]);
});
