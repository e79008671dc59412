import { statusPageResponse } from "./status_page.ts";

Deno.test("status_page: @module", async () => {
  const response = statusPageResponse();
  if (!response.headers.get("content-type")?.startsWith("text/html")) throw new Error();
  if (!(await response.text()).includes('fetch("status/data"')) throw new Error();
});
