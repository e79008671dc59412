import { DTYPE_ITEM_SIZES, isDType, tensorByteLength } from "./mod.ts";

Deno.test("dtypes: DTYPE_ITEM_SIZES", () => {
  if (DTYPE_ITEM_SIZES.bfloat16 !== 2) throw new Error();
});

Deno.test("dtypes: isDType", () => {
  if (!isDType("float32") || isDType("uint16") || isDType("toString")) throw new Error();
});

Deno.test("dtypes: tensorByteLength", () => {
  if (tensorByteLength("float32", [2, 3]) !== 24) throw new Error();
});
