import { withFieldLines } from "./http1_response.ts";

Deno.test("http1_response: withFieldLines", () => {
  const fields: [string, string][] = [["x-a", "1"], ["x-a", "2"]];
  const response = withFieldLines(new Response("ok", { headers: fields }), fields);
  if (response.headers.get("x-a") !== "1, 2") throw new Error(); // written as two lines
});
