import { codePointIndex, comparePy, pySorted } from "./python_str.ts";

Deno.test("python_str: comparePy", () => {
  // U+1F600 sorts after U+FFFD in Python; UTF-16 code units say otherwise.
  if (comparePy("\u{1f600}", "\ufffd") <= 0) throw new Error();
});

Deno.test("python_str: pySorted", () => {
  if (pySorted(["b", "a", "B"]).join() !== "B,a,b") throw new Error();
});

Deno.test("python_str: codePointIndex", () => {
  if (codePointIndex("\u{1f600}x", 2) !== 1) throw new Error();
});
