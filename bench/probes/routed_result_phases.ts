/**
 * Where a large routed result's time goes: one tree's Router and node (2 reused workers,
 * `bench/_routed_ab.ts`), a `--mib` MiB `bytes` result (64 by default) direct and through the
 * Router, alternating, read with the platform's `fetch` (no client code in the figures) and then
 * with the tree's `Client`. Prints per way the median time to the response head, to the first
 * body byte and to the last, and the CPU per request of the node's server and of the Router
 * (from /proc).
 *
 *   deno run -A bench/probes/routed_result_phases.ts [TREE] [--requests N] [--mib N] [gpu]
 *
 * @module
 */
import { median, numberArg, positionalArgs } from "./_probe.ts";

const tree = Deno.realPathSync(positionalArgs()[0] ?? new URL("../..", import.meta.url).pathname);
const mib = numberArg("--mib", 64);
const requests = numberArg("--requests", 10);
const mode = Deno.args.includes("gpu") ? "gpu" : "cpu";

const { startRoutedSide, stopRoutedSides } = await import(`${tree}/bench/_routed_ab.ts`);
const { bytesResultProgram } = await import(`${tree}/bench/_programs.ts`);
const { multipartBody } = await import(`${tree}/tests/_server.ts`);
const { childPid, ownCpuMs } = await import(`${tree}/bench/_proc.ts`);

const side = await startRoutedSide(tree, mode);
const server = childPid(side.node.pid);
const program = bytesResultProgram(mib);
const { body, contentType } = multipartBody([
  { name: "program", contentType: "application/json", body: program.toJson() },
]);

/** [head, first byte, last byte] in ms, by `fetch`. */
async function viaFetch(url: string): Promise<number[]> {
  const start = performance.now();
  const response = await fetch(`${url}/execute`, {
    method: "POST",
    body,
    headers: { "content-type": contentType },
  });
  const head = performance.now() - start;
  let first = -1;
  let bytes = 0;
  for await (const chunk of response.body!) {
    if (first < 0 && chunk.length > 0) first = performance.now() - start;
    bytes += chunk.length;
  }
  if (bytes < mib << 20) throw new Error("short result");
  return [head, first, performance.now() - start];
}

/** The whole request by the tree's client (head and bytes are not told apart). */
async function viaClient(way: "direct" | "routed"): Promise<number[]> {
  const start = performance.now();
  await side[way].execute(program);
  const elapsed = performance.now() - start;
  return [elapsed, elapsed, elapsed];
}

try {
  for (const how of ["fetch", "client"]) {
    const times = { direct: [] as number[][], routed: [] as number[][] };
    const cpu = { direct: [0, 0], routed: [0, 0] };
    for (let i = 0; i < requests + 2; i++) {
      for (const way of ["direct", "routed"] as const) {
        const serverBefore = ownCpuMs(server);
        const routerBefore = ownCpuMs(side.router.pid);
        const t = how === "fetch"
          ? await viaFetch(way === "direct" ? side.node.url : side.router.url)
          : await viaClient(way);
        if (i < 2) continue; // warm-up
        times[way].push(t);
        cpu[way][0] += ownCpuMs(server) - serverBefore;
        cpu[way][1] += ownCpuMs(side.router.pid) - routerBefore;
      }
    }
    for (const way of ["direct", "routed"] as const) {
      const at = (k: number) => median(times[way].map((t) => t[k])).toFixed(1);
      console.log(
        `${how} ${way}: head ${at(0)} ms, first byte ${at(1)} ms, last byte ${at(2)} ms; ` +
          `CPU per request: node server ${(cpu[way][0] / requests).toFixed(0)} ms, Router ` +
          `${(cpu[way][1] / requests).toFixed(0)} ms (medians of ${requests})`,
      );
    }
  }
} finally {
  await stopRoutedSides([side]);
}
