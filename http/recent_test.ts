import { numberOrNull, Recent, stringOrNull } from "./recent.ts";

Deno.test("recent: @module", () => {
  const recent = new Recent(2, (r) => ({ id: r.request_id }));
  for (const id of ["a", "b", "c"]) recent.add({ request_id: id });
  if (recent.list().map((r) => r.id).join() !== "c,b") throw new Error();
});

Deno.test("recent: numberOrNull", () => {
  if (numberOrNull(1.5) !== 1.5 || numberOrNull("1.5") !== null) throw new Error();
});

Deno.test("recent: stringOrNull", () => {
  if (stringOrNull("ok") !== "ok" || stringOrNull(7) !== null) throw new Error();
});
