/**
 * `ExecuteOptions.onProgress` against a real CPU server: the upload is reported as it is
 * written and ends at its total; the answer's download likewise; a transport that cannot watch
 * its bytes (`fetch`) reports nothing and the call still works.
 */
import assert from "node:assert/strict";
import { Client, Program, type TransferProgress } from "../mod.ts";
import { startServer } from "./_server.ts";

function echoProgram(bytes: Uint8Array): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def echo(b):\n    return bytes(b)\n" });
  const blob = program.upload({ kind: "bytes", value: bytes });
  program.return_({
    key: "echo",
    value: program.run({ fn: program.getFunction({ module: mod, name: "echo" }), args: [blob] }),
  });
  return program;
}

Deno.test("client: onProgress reports the upload and the download up to their totals", async () => {
  const server = await startServer();
  try {
    await using client = new Client(server.url);
    const payload = new Uint8Array(6 << 20).map((_, i) => i % 251);
    const seen: TransferProgress[] = [];
    const result = await client.execute(echoProgram(payload), {
      onProgress: (p) => seen.push({ ...p }),
    });
    assert.ok(result.completed);
    assert.equal((result.results.get("echo") as Uint8Array).length, payload.length);
    // The first request names the blob by its hash (the server has not seen it: CACHE_MISS),
    // the second carries it: each request's reports run up to its own total.
    for (const direction of ["upload", "download"] as const) {
      const reports = seen.filter((p) => p.direction === direction);
      const large = reports.filter((p) => p.total > payload.length);
      assert.ok(large.length >= 2, `${direction}: ${large.length} reports of the large body`);
      assert.ok(large.every((p, i) => i === 0 || p.bytes >= large[i - 1].bytes));
      assert.equal(large.at(-1)!.bytes, large[0].total);
      assert.ok(reports.every((p) => p.bytes <= p.total));
    }
    // The large upload is over before the large download begins.
    const lastUpload = seen.findLastIndex((p) => p.direction === "upload");
    const lastDownload = seen.findLastIndex((p) => p.direction === "download");
    assert.ok(lastUpload < lastDownload);

    await using viaFetch = new Client(server.url, { transport: "fetch" });
    const quiet: TransferProgress[] = [];
    const again = await viaFetch.execute(echoProgram(payload.subarray(0, 1024)), {
      onProgress: (p) => quiet.push(p),
    });
    assert.ok(again.completed);
    assert.deepEqual(quiet, []);
  } finally {
    await server.stop();
  }
});
