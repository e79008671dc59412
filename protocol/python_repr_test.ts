import { pyFloatRepr, pyListRepr, pyRepr, pyStrRepr, type PyValue } from "./python_repr.ts";

Deno.test("python_repr: PyValue", () => {
  const value: PyValue = new Map([["k", [1, null]]]);
  if (pyRepr(value) !== "{'k': [1, None]}") throw new Error();
});

Deno.test("python_repr: pyStrRepr", () => {
  if (pyStrRepr("../x") !== "'../x'") throw new Error();
  if (pyStrRepr("it's") !== `"it's"`) throw new Error();
  if (pyStrRepr("a\u00a0\n") !== "'a\\xa0\\n'") throw new Error();
});

Deno.test("python_repr: pyFloatRepr", () => {
  if (pyFloatRepr(1) !== "1.0" || pyFloatRepr(1e16) !== "1e+16") throw new Error();
});

Deno.test("python_repr: pyRepr", () => {
  if (pyRepr(null) !== "None" || pyRepr([true, "a"]) !== "[True, 'a']") throw new Error();
});

Deno.test("python_repr: pyListRepr", () => {
  if (pyListRepr(["a", "b"]) !== "['a', 'b']") throw new Error();
});
