// The server keeps no memory per finished request: a kept worker serves thousands of requests,
// and anything a request leaves reachable (say, a reaction on the worker's long-lived exit
// promise holding the request's whole context) grows the heap until the process dies.
import assert from "node:assert/strict";

Deno.test("server: the heap does not grow with the number of requests served", async () => {
  const script = new URL("./fixtures/memory/heap_per_request.ts", import.meta.url).pathname;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--v8-flags=--expose-gc", script, "2000"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(output.stdout);
  assert.ok(output.success, new TextDecoder().decode(output.stderr).slice(-2000));
  const { bytesPerRequest } = JSON.parse(stdout.trim().split("\n").at(-1)!);
  // A request's context is several KB (the leak this guards against kept ~4.5 KB each); what
  // stays reachable must be far less.
  assert.ok(
    bytesPerRequest < 500,
    `the heap grew by ${bytesPerRequest.toFixed(0)} bytes per request`,
  );
});
