import { sha256Hex } from "./mod.ts";

Deno.test("hash: sha256Hex", () => {
  const hash = sha256Hex(new TextEncoder().encode("hello\n"));
  if (hash !== "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03") {
    throw new Error();
  }
});
