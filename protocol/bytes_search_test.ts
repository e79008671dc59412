import { DelimiterFinder } from "./bytes_search.ts";

Deno.test("bytes_search: DelimiterFinder", () => {
  const finder = new DelimiterFinder(new TextEncoder().encode("\r\n--B"));
  const body = new TextEncoder().encode("data\r\n--B--");
  if (finder.find(body, 0) !== 4 || finder.find(body, 5) !== -1) throw new Error();
});
