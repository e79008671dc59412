import { headEnd, parseRequestHead } from "./http1_head.ts";

Deno.test("http1_head: headEnd", () => {
  const bytes = new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\n\r\nbody");
  if (headEnd(bytes, 0, bytes.length) !== bytes.length - 4) throw new Error();
  if (headEnd(bytes, 0, 10) !== -1) throw new Error();
});

Deno.test("http1_head: parseRequestHead", () => {
  const head = parseRequestHead(new TextEncoder().encode(
    "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
  ));
  if (head.method !== "POST" || head.framing.kind !== "length" || !head.keepAlive) {
    throw new Error();
  }
});
