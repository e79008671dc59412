import { stringifyJson } from "./json_stringify.ts";

Deno.test("json_stringify: stringifyJson", () => {
  const text = stringifyJson(new Map<string, unknown>([["é", [1, 2n ** 64n, 0.5]]]));
  if (text !== '{"é":[1,18446744073709551616,0.5]}') throw new Error(text);
});
