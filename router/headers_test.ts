import { forwardedHeaders, forwardedResponseEntries, validHeaderEntries } from "./headers.ts";

Deno.test("headers: forwardedHeaders", () => {
  const headers = new Headers({ connection: "x-private", "x-private": "1", "x-keep": "2" });
  headers.append("set-cookie", "a=1");
  headers.append("set-cookie", "b=2");
  const out = forwardedHeaders(headers, ["host"]);
  if (JSON.stringify(out) !== '[["set-cookie","a=1"],["set-cookie","b=2"],["x-keep","2"]]') {
    throw new Error(JSON.stringify(out));
  }
});

Deno.test("headers: forwardedResponseEntries", () => {
  const entries = forwardedResponseEntries([
    ["Connection", "x-private"],
    ["x-private", "1"],
    ["x-a", "1"],
    ["x-a", "2"],
    ["Content-Length", "5"],
    ["set-cookie", "a=1"],
  ], ["content-length"]);
  if (JSON.stringify(entries) !== '[["x-a","1"],["x-a","2"],["set-cookie","a=1"]]') {
    throw new Error(JSON.stringify(entries));
  }
});

Deno.test("headers: validHeaderEntries", () => {
  if (!validHeaderEntries([["content-type", "application/json"], ["x-a", " 1\r\n"]])) {
    throw new Error("valid entries refused");
  }
  if (validHeaderEntries([["bad name", "1"]]) || validHeaderEntries([["x-a", "1\r\nx: 2"]])) {
    throw new Error("invalid entries taken");
  }
});
