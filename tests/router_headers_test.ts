/**
 * The headers that cross the Router (router/headers.ts): the response entries filtered straight
 * from a node's are the headers the general rule gives for the same headers, and repeated names
 * stay separate entries.
 */
import assert from "node:assert/strict";
import {
  DROPPED_RESPONSE_HEADERS,
  forwardedHeaders,
  forwardedResponseEntries,
  validHeaderEntries,
} from "../router/headers.ts";
import type { HeaderEntry } from "../link/messages.ts";

/** The general rule: the entries as `Headers`, filtered, and back into `Headers`. */
function viaGeneralRule(entries: HeaderEntry[], drop: readonly string[]): Headers {
  const whole = new Headers();
  for (const [name, value] of entries) whole.append(name, value);
  const out = new Headers();
  for (const [name, value] of forwardedHeaders(whole, drop)) out.append(name, value);
  return out;
}

const cases: HeaderEntry[][] = [
  [],
  [["content-type", "application/json"], ["content-length", "22"]],
  [["Content-Type", "text/plain"], ["X-Request-ID", "node's"], ["X-KCoral-Node", "other"]],
  [["connection", "X-Private, keep-alive"], ["x-private", "1"], ["Keep-Alive", "5"], ["x-b", "2"]],
  [["Connection", "x-a"], ["connection", " x-b ,"], ["x-a", "1"], ["X-B", "2"], ["x-c", "3"]],
  [["set-cookie", "a=1"], ["Set-Cookie", "b=2"], ["x-d", "1"], ["x-d", "2"]],
  [["connection", "set-cookie"], ["set-cookie", "a=1"], ["x-e", "1"]],
  [["transfer-encoding", "chunked"], ["upgrade", "h2c"], ["te", "trailers"], ["trailer", "x"]],
  [["proxy-authenticate", "Basic"], ["x-f", "  padded  "], ["x-g", ""]],
];

Deno.test("router headers: a node's response entries give the general rule's headers", () => {
  for (const entries of cases) {
    for (const drop of [DROPPED_RESPONSE_HEADERS, [] as string[], ["x-b", "set-cookie"]]) {
      const fast = new Headers(forwardedResponseEntries(entries, drop));
      const general = viaGeneralRule(entries, drop);
      const label = JSON.stringify({ entries, drop });
      assert.deepEqual([...fast], [...general], label);
      assert.deepEqual(fast.getSetCookie(), general.getSetCookie(), label);
    }
  }
});

Deno.test("router headers: hop-by-hop, Connection-named and dropped names never reach the client; repeated ones stay apart", () => {
  const entries = forwardedResponseEntries([
    ["Connection", "X-Private"],
    ["X-Private", "secret"],
    ["Transfer-Encoding", "chunked"],
    ["Content-Length", "7"],
    ["X-Request-ID", "spoofed"],
    ["X-Repeated", "1"],
    ["Set-Cookie", "a=1"],
    ["x-repeated", "2"],
    ["set-cookie", "b=2"],
  ], DROPPED_RESPONSE_HEADERS);
  assert.deepEqual(entries, [
    ["X-Repeated", "1"],
    ["Set-Cookie", "a=1"],
    ["x-repeated", "2"],
    ["set-cookie", "b=2"],
  ]);
});

Deno.test("router headers: validHeaderEntries takes exactly the entries Headers takes", () => {
  const names = ["a", "", "a b", "a:b", "é", "x`y", "x\u0100", "(x)", "a\tb", "A-B_c.d"];
  const values = [
    "",
    " v ",
    "v\r\n",
    "\r\nv",
    "v\0",
    "a\rb",
    "a\nb",
    "é",
    "\u0100",
    "\u00ff",
    "a\tb",
    "\t",
    "\x7f",
    "\x01",
  ];
  for (const name of names) {
    for (const value of values) {
      let taken = true;
      try {
        new Headers([[name, value]]);
      } catch {
        taken = false;
      }
      assert.equal(
        validHeaderEntries([["x-ok", "1"], [name, value]]),
        taken,
        `${JSON.stringify(name)}: ${JSON.stringify(value)}`,
      );
    }
  }
});
