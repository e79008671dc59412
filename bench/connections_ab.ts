/**
 * The connection handling's cost (docs/decisions/own-http1-connections.md): the server
 * bench's rows that a change of HTTP layer could move — a trivial program on a reused worker,
 * a 64 MiB `c = a + b` with cached inputs (a 64 MiB answer), and a cache-miss resend (a 128 MiB
 * request) — on two `kcoral server` processes in the same session, one from this tree and one
 * from another checkout (e.g. the commit before, unpacked with `git archive`), measured in
 * alternating rounds so that both see the same machine. Simulated GPUs (torch CPU tensors), or
 * GPU 0 with `--mode gpu`.
 *
 *   git archive <before> | tar -x -C /tmp/kcoral-before
 *   deno run -A bench/connections_ab.ts --before /tmp/kcoral-before [--rounds 4] [--mode gpu]
 *
 * @module
 */
import { Client } from "../mod.ts";
import { addProgram, randomFloats, trivialProgram } from "./_programs.ts";
import { type BenchRow, row, summarize, table } from "./_stats.ts";

interface _Server {
  url: string;
  stop(): Promise<void>;
}

async function _start(cli: string, mode: "sim" | "gpu"): Promise<_Server> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      cli,
      "server",
      "--port",
      String(port),
      "--log-dir",
      "",
      "--no-log-console",
      "--sandbox",
      "none",
      "--max-requests-per-worker",
      "0",
      "--disk-cache-dir",
      "",
      "--device",
      "gpu",
      "--gpus",
      "0",
      "--workers-per-gpu",
      "2",
      ...(mode === "sim" ? ["--simulate-gpus"] : []),
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (!seen.includes("Application startup complete.")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`server exited during start:\n${seen}`);
    seen += value;
  }
  (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })().catch(() => {});
  return {
    url: `http://127.0.0.1:${port}`,
    async stop() {
      child.kill("SIGTERM");
      await child.status;
    },
  };
}

async function _round(url: string, quick: boolean) {
  await using client = new Client(url);
  const trivial: number[] = [];
  const program = trivialProgram();
  for (let i = 0; i < (quick ? 30 : 120); i++) {
    const start = performance.now();
    const result = await client.execute(program);
    if (!result.completed) throw new Error(JSON.stringify(result.error));
    if (i >= 10) trivial.push(performance.now() - start);
  }
  const n = 16 * 1024 * 1024;
  const add = addProgram(randomFloats(n), randomFloats(n));
  await client.execute(add); // uploads the inputs once
  const cached: number[] = [];
  for (let i = 0; i < (quick ? 3 : 7); i++) {
    const start = performance.now();
    const result = await client.execute(add);
    if (!result.completed) throw new Error(JSON.stringify(result.error));
    cached.push(performance.now() - start);
  }
  const resend: number[] = [];
  const cachedMedian = summarize(cached).median;
  for (let i = 0; i < (quick ? 1 : 2); i++) {
    const fresh = addProgram(randomFloats(n), randomFloats(n));
    const start = performance.now();
    const result = await client.execute(fresh);
    if (!result.completed) throw new Error(JSON.stringify(result.error));
    resend.push((performance.now() - start - cachedMedian) / 128);
  }
  return { trivial, cached, resend };
}

if (import.meta.main) {
  const arg = (name: string) => {
    const i = Deno.args.indexOf(name);
    return i >= 0 ? Deno.args[i + 1] : undefined;
  };
  const before = arg("--before");
  if (!before) throw new Error("--before <checkout> is required");
  const rounds = Number(arg("--rounds") ?? 4);
  const quick = Deno.args.includes("--quick");
  const mode = arg("--mode") === "gpu" ? "gpu" : "sim";
  const trees = {
    before: `${before}/cli.ts`,
    after: new URL("../cli.ts", import.meta.url).pathname,
  };
  const samples = {
    before: { trivial: [] as number[], cached: [] as number[], resend: [] as number[] },
    after: { trivial: [] as number[], cached: [] as number[], resend: [] as number[] },
  };
  const servers = {
    before: await _start(trees.before, mode),
    after: await _start(trees.after, mode),
  };
  try {
    for (let round = 0; round < rounds; round++) {
      // Alternating which goes first.
      const order = round % 2 === 0
        ? (["before", "after"] as const)
        : (["after", "before"] as const);
      for (const which of order) {
        const got = await _round(servers[which].url, quick);
        samples[which].trivial.push(...got.trivial);
        samples[which].cached.push(...got.cached);
        samples[which].resend.push(...got.resend);
      }
    }
  } finally {
    await servers.before.stop();
    await servers.after.stop();
  }
  const rows: BenchRow[] = [];
  for (const which of ["before", "after"] as const) {
    const s = samples[which];
    rows.push(row(`${which}: reused worker, trivial program, e2e (${mode})`, "ms", s.trivial));
    rows.push(row(`${which}: 64 MiB c = a + b, inputs cached, e2e (${mode})`, "ms", s.cached));
    rows.push(row(`${which}: cache-miss resend cost (${mode})`, "ms/MiB", s.resend));
  }
  console.log(table(rows));
  const ratio = (key: "trivial" | "cached" | "resend") =>
    (summarize(samples.after[key]).median / summarize(samples.before[key]).median).toFixed(3);
  console.log(
    `after/before medians: trivial ${ratio("trivial")}, 64 MiB cached ${ratio("cached")}, ` +
      `resend ${ratio("resend")}`,
  );
}
