// After large requests the server's resident memory comes back once it is idle
// (docs/decisions/memory-after-large-requests.md, "Memory comes back after large requests"): its body pools, the hashing
// threads' views of them and the garbage of the requests are given back, and the next large
// request works as before. A real server process, so that its RSS is its own.
import assert from "node:assert/strict";
import { Client } from "../mod.ts";
import { randomBytes } from "./_bytes.ts";
import { freePort, KcoralProcess } from "./_router.ts";
import { lengthProgram } from "../bench/_programs.ts";

const _MIB = 1 << 20;

function _status(pid: number, field: "VmRSS" | "VmHWM"): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status)![1]) * 1024;
}

Deno.test({
  name: "server: RSS returns near its idle baseline after large uploads",
  ignore: Deno.build.os !== "linux",
  async fn() {
    const port = freePort();
    const server = new KcoralProcess([
      "server",
      ...["--device", "cpu", "--num-workers", "1", "--max-requests-per-worker", "0"],
      ...["--sandbox", "none", "--port", String(port), "--no-log-console", "--log-dir", ""],
      ...["--disk-cache-dir", "", "--cache-capacity-bytes", "0"],
    ]);
    const pid = server.child.pid;
    try {
      await server.waitForLine(/Application startup complete\./, 60_000);
      await using client = new Client(`http://127.0.0.1:${port}`);
      const payload = randomBytes(192 * _MIB);
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const baseline = _status(pid, "VmRSS");
      Deno.writeTextFileSync(`/proc/${pid}/clear_refs`, "5"); // VmHWM := VmRSS
      const first = await client.execute(lengthProgram(payload));
      assert.equal(first.get("n"), payload.length, JSON.stringify(first.error));
      const rise = _status(pid, "VmHWM") - baseline;
      assert.ok(rise >= 300 * _MIB, `the upload raised RSS by only ${rise / _MIB} MiB`);
      // Idle from here: back within 256 MiB of the baseline well before 25 s.
      const idleStart = performance.now();
      let rss = _status(pid, "VmRSS");
      while (rss > baseline + 256 * _MIB && performance.now() - idleStart < 25_000) {
        await new Promise((resolve) => setTimeout(resolve, 250));
        rss = _status(pid, "VmRSS");
      }
      assert.ok(
        rss <= baseline + 256 * _MIB,
        `RSS ${(rss / _MIB).toFixed(0)} MiB after 25 s idle (baseline ${
          (baseline / _MIB).toFixed(0)
        } MiB, peak +${(rise / _MIB).toFixed(0)} MiB)`,
      );
      // The next large upload is served as before (new hashing threads, new buffers).
      payload[0] ^= 1;
      const second = await client.execute(lengthProgram(payload));
      assert.equal(second.get("n"), payload.length, JSON.stringify(second.error));
    } finally {
      await server.stop();
    }
  },
});
