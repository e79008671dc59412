/**
 * Whether `Deno.serve` aborts a request's `signal` when its client closes the connection while
 * the handler waits, by request size (docs/operations.md, Known limits: "A client that goes away
 * is noticed only when `Deno.serve` notices it"). Each request is sent whole (head and body of
 * `N` bytes), the client closes after 300 ms, and the handler waits up to 2 s for the abort;
 * with `--read` the handler reads the body first.
 *
 *   deno run -A bench/probes/client_gone_signal.ts [--read]
 *
 * @module
 */
const read = Deno.args.includes("--read");
const outcomes: string[] = [];
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
  const signal = request.signal;
  if (read) await request.bytes();
  const start = performance.now();
  const aborted = await new Promise<boolean>((resolve) => {
    if (signal.aborted) return resolve(true);
    const timer = setTimeout(() => resolve(false), 2000);
    signal.addEventListener("abort", () => (clearTimeout(timer), resolve(true)));
  });
  outcomes.push(
    aborted ? `aborted after ${(performance.now() - start).toFixed(0)} ms` : "not aborted in 2 s",
  );
  return new Response("x");
});
console.log(`| request bytes (head + body) | signal${read ? " (body read first)" : ""} |`);
console.log("|---|---|");
for (const bodyBytes of [5, 380, 410, 416, 417, 430, 1000, 60000]) {
  const head = `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n` +
    `content-length: ${bodyBytes}\r\n\r\n`;
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  await conn.write(new TextEncoder().encode(head + "x".repeat(bodyBytes)));
  await new Promise((resolve) => setTimeout(resolve, 300));
  conn.close();
  while (outcomes.length === 0) await new Promise((resolve) => setTimeout(resolve, 50));
  console.log(`| ${head.length + bodyBytes} | ${outcomes.shift()} |`);
}
await server.shutdown();
