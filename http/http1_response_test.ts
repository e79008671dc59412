import { fieldLinesResponse, withFieldLines } from "./http1_response.ts";

Deno.test("http1_response: withFieldLines", () => {
  const fields: [string, string][] = [["x-a", "1"], ["x-a", "2"]];
  const response = withFieldLines(new Response("ok", { headers: fields }), fields);
  if (response.headers.get("x-a") !== "1, 2") throw new Error(); // written as two lines
});

Deno.test("http1_response: fieldLinesResponse has the headers an init would give", async () => {
  const fields: [string, string][] = [["X-A", "1"], ["x-b", " 2 "], ["x-a", "3"], [
    "content-length",
    "2",
  ]];
  const bytes = new TextEncoder().encode("ok");
  const response = fieldLinesResponse(bytes, 503, fields);
  const made = new Response(bytes, { status: 503, headers: fields });
  if (response.status !== 503 || [...response.headers].join() !== [...made.headers].join()) {
    throw new Error([...response.headers].join());
  }
  if ((await response.text()) !== "ok") throw new Error();
  let refused = false;
  try {
    fieldLinesResponse(null, 200, [["bad name", "x"]]);
  } catch (error) {
    refused = error instanceof TypeError;
  }
  if (!refused) throw new Error("an invalid field name was taken");
});
