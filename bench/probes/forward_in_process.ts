/**
 * The Router's forwarding code by itself, in one process, no sockets: `forwardExecute` through a
 * registered slot whose socket answers each request in a microtask (a whole frame), against
 * building the same request and answer alone; then the parts it is made of, each timed alone:
 * reading headers (`for…of` against `forEach`), a frame's request id (spread against `apply`),
 * the whole frames, the `request_finished` event. Microseconds per call, best of 3 runs.
 *
 *   deno run -A bench/probes/forward_in_process.ts [--requests N]
 *
 * @module
 */
import { DROPPED_REQUEST_HEADERS, forwardedHeaders } from "../../router/headers.ts";
import { decodeWholeFrame, encodeWholeFrame } from "../../protocol/node_link.ts";
import { forwarding } from "./_forwarding.ts";
import { numberArg } from "./_probe.ts";

const N = numberArg("--requests", 20_000);
const loop = await forwarding();
const { newRequest, answer, answerHeaders, events } = loop;
const body = new Uint8Array([120]);
const id = crypto.randomUUID();
const headers = newRequest().headers;
const frame = encodeWholeFrame({
  t: "response_head",
  request_id: id,
  status: 200,
  headers: answerHeaders,
}, answer)!;

const cases: [string, () => unknown][] = [
  ["request and answer alone", async () => {
    await newRequest().bytes();
    await new Response(answer, { headers: answerHeaders }).arrayBuffer();
  }],
  ["forwardExecute, answered in a microtask", () => loop.run()],
  ["seven headers read with for…of", () => {
    const out = [];
    for (const entry of headers) out.push(entry);
    return out;
  }],
  ["seven headers read with forEach", () => {
    const out: [string, string][] = [];
    headers.forEach((value, name) => out.push([name, value]));
    return out;
  }],
  ["forwardedHeaders(request headers)", () => forwardedHeaders(headers, DROPPED_REQUEST_HEADERS)],
  ["request id by spread", () => String.fromCharCode(...frame.subarray(1, 37))],
  [
    "request id by apply",
    () => String.fromCharCode.apply(null, frame.subarray(1, 37) as unknown as number[]),
  ],
  ["encodeWholeFrame", () =>
    encodeWholeFrame({
      t: "request_head",
      request_id: id,
      headers: answerHeaders,
      content_length: 1,
    }, body)],
  ["decodeWholeFrame", () => decodeWholeFrame(frame)],
  ["request_finished event", () =>
    events.emit("INFO", "request_finished", {
      request_id: id,
      node: "n",
      http_status: 200,
      finish_reason: "completed",
    })],
];

for (const [name, run] of cases) {
  for (let i = 0; i < 3000; i++) await run();
  let best = Infinity;
  for (let round = 0; round < 3; round++) {
    const start = performance.now();
    for (let i = 0; i < N; i++) await run();
    best = Math.min(best, (performance.now() - start) / N * 1000);
  }
  events.flush();
  console.log(`${best.toFixed(2).padStart(8)} µs  ${name}`);
}
loop.close();
