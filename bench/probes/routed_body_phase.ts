/**
 * Which process holds up a large routed answer, and how much fresh memory it faults in: one
 * tree's Router and node (2 reused workers, `bench/_routed_ab.ts`), a `--mib` MiB `bytes` result
 * (64 by default) direct and through the Router, alternating.
 *
 * - With `fetch` as the client: per way, the median time to the response head and from the head
 *   to the last byte (the body), and during the body the on-CPU ms of the node server's and the
 *   Router's main threads (all their threads in brackets) and of this process (the client), from
 *   `/proc/PID/task/TID/schedstat` (ns), and each process's minor page faults.
 * - With the tree's own `Client`: the same per whole request, for that result and for a fresh
 *   `--mib` MiB `bytes` upload (a new blob each time: the request, its CACHE_MISS and the resend).
 *
 * A main thread on CPU for most of the body is what limits it (docs/decisions/malloc-thresholds.md, "Malloc
 * thresholds").
 *
 *   deno run -A bench/probes/routed_body_phase.ts [TREE] [--requests N] [--mib N] [gpu]
 *
 * @module
 */
import { median, numberArg, positionalArgs } from "./_probe.ts";

const tree = Deno.realPathSync(positionalArgs()[0] ?? new URL("../..", import.meta.url).pathname);
const mib = numberArg("--mib", 64);
const requests = numberArg("--requests", 8);

const { startRoutedSide, stopRoutedSides } = await import(`${tree}/bench/_routed_ab.ts`);
const { bytesResultProgram, lengthProgram, randomBytes } = await import(
  `${tree}/bench/_programs.ts`
);
const { multipartBody } = await import(`${tree}/tests/_server.ts`);
const { childPid } = await import(`${tree}/bench/_proc.ts`);

const side = await startRoutedSide(tree, Deno.args.includes("gpu") ? "gpu" : "cpu");
const server = childPid(side.node.pid)!;
const program = bytesResultProgram(mib);
const { body, contentType } = multipartBody([
  { name: "program", contentType: "application/json", body: program.toJson() },
]);

/** On-CPU ms of `pid`'s main thread, or of all its threads. */
function onCpuMs(pid: number, allThreads: boolean): number {
  const threads = allThreads
    ? [...Deno.readDirSync(`/proc/${pid}/task`)].map((entry) => entry.name)
    : [String(pid)];
  let ns = 0;
  for (const thread of threads) {
    try {
      ns += Number(Deno.readTextFileSync(`/proc/${pid}/task/${thread}/schedstat`).split(" ")[0]);
    } catch { /* the thread ended */ }
  }
  return ns / 1e6;
}

function minorFaults(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[7]);
}

const _FIGURES = [
  "node main",
  "node all",
  "Router main",
  "Router all",
  "client main",
  "node faults",
  "Router faults",
  "client faults",
];

function snapshot(): number[] {
  const router = side.router.pid;
  return [
    onCpuMs(server, false),
    onCpuMs(server, true),
    onCpuMs(router, false),
    onCpuMs(router, true),
    onCpuMs(Deno.pid, false),
    minorFaults(server),
    minorFaults(router),
    minorFaults(Deno.pid),
  ];
}

function report(label: string, rows: number[][], times: string[]): void {
  const at = (k: number) => median(rows.map((row) => row[k])).toFixed(1);
  const figures = _FIGURES.map((name, k) => `${name} ${at(times.length + k)}`);
  const timed = times.map((name, k) => `${name} ${at(k)} ms`);
  console.log(`${label}: ${timed.join(", ")}; ${figures.join(", ")} (medians of ${rows.length})`);
}

/**
 * `requests` whole requests each way through the tree's own `Client` (after two uncounted), a
 * program from `programFor` each time, the two ways taking turns to go first when `alternate`;
 * reported as `client <way>, <label>`.
 */
async function timeWholeRequests(label: string, programFor: () => unknown, alternate: boolean) {
  const rows = { direct: [] as number[][], routed: [] as number[][] };
  for (let i = 0; i < requests + 2; i++) {
    const ways = alternate && i % 2 === 1
      ? ["routed", "direct"] as const
      : ["direct", "routed"] as const;
    for (const way of ways) {
      const request = programFor();
      const before = snapshot();
      const start = performance.now();
      await side[way].execute(request);
      const elapsed = performance.now() - start;
      const after = snapshot();
      if (i < 2) continue;
      rows[way].push([elapsed, ...after.map((v, k) => v - before[k])]);
    }
  }
  for (const way of ["direct", "routed"] as const) {
    report(`client ${way}, ${label}`, rows[way], ["total"]);
  }
}

try {
  const viaFetch = { direct: [] as number[][], routed: [] as number[][] };
  for (let i = 0; i < requests + 2; i++) {
    for (const way of ["direct", "routed"] as const) {
      const url = way === "direct" ? side.node.url : side.router.url;
      const start = performance.now();
      const response = await fetch(`${url}/execute`, {
        method: "POST",
        body,
        headers: { "content-type": contentType },
      });
      const head = performance.now();
      const before = snapshot();
      let bytes = 0;
      for await (const chunk of response.body!) bytes += chunk.length;
      const end = performance.now();
      const after = snapshot();
      if (bytes < mib << 20) throw new Error("short result");
      if (i < 2) continue; // warm-up
      viaFetch[way].push([head - start, end - head, ...after.map((v, k) => v - before[k])]);
    }
  }
  for (const way of ["direct", "routed"] as const) {
    report(`fetch ${way}, during the body`, viaFetch[way], ["head", "body"]);
  }
  await timeWholeRequests("whole request", () => program, false);
  // A new blob each time; alternating which way goes first, as the Router bench does.
  await timeWholeRequests("fresh upload", () => lengthProgram(randomBytes(mib << 20)), true);
} finally {
  await stopRoutedSides([side]);
}
