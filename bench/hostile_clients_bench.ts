/**
 * Issue 44's hostile-client figures on a CPU `kcoral server` process (one worker), or on a
 * `kcoral router` with one CPU node (`--target router`): `--heads` connections that send half a
 * request head and `--bodies` that send a head and the start of a body, then one byte every
 * `--trickle-seconds` `--trickle-bytes` times, then nothing, all opened at once by a load
 * generator in a process of its own (this script with `--attack`); meanwhile `/health` is asked
 * every 20 ms on a new connection each time, and one normal program runs. Prints, by phase
 * (opening them, all stalled, the target cutting them, after): `/health`'s latencies (p50, p99,
 * max) and the target's own event-loop delay (how late a 5 ms timer in the target ran, measured
 * by the `bench/_loop_delay.ts` preload: what its `/health` waits behind, without the load
 * generator's share of the two cores); whether the program completed; how long after its last
 * byte each stalled connection was closed, against the timeouts. With `--before DIR` the rounds
 * alternate between that checkout (e.g. `git worktree add DIR <commit>`) and this one, and a
 * table of both trees' round medians follows; `--raw FILE` keeps every probe and tick as JSON. Needs a descriptor limit above heads + bodies
 * (`ulimit -n`).
 *
 *   deno run -A bench/hostile_clients_bench.ts [--target server|router] [--heads 3000]
 *     [--bodies 500] [--header-timeout 10] [--body-timeout 10] [--trickle-seconds 1]
 *     [--trickle-bytes 3] [--rounds 1] [--before DIR] [--raw FILE] [--target-flags "FLAGS"]
 *
 * @module
 */
import { callProgram, multipartBody } from "../tests/_server.ts";
import { freePort, startNodeProcess, waitForCapacity } from "./_routed.ts";
import { ownCpuMs } from "./_proc.ts";

const _encoder = new TextEncoder();
const _CLI = new URL("../cli.ts", import.meta.url).pathname;
const _SELF = new URL(import.meta.url).pathname;
const _PRELOAD = new URL("./_loop_delay.ts", import.meta.url).pathname;

function _arg(name: string, fallback: number): number {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Number(Deno.args[i + 1]) : fallback;
}

function _text(name: string, fallback: string): string {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : fallback;
}

const heads = _arg("--heads", 3000);
const bodies = _arg("--bodies", 500);
const headerTimeout = _arg("--header-timeout", 10);
const bodyTimeout = _arg("--body-timeout", 10);
const trickleSeconds = _arg("--trickle-seconds", 1);
const trickleBytes = _arg("--trickle-bytes", 3);
/** Deno flags for the target process (e.g. `--v8-flags=--trace-gc`; its stdout is then shown). */
const targetFlags = _text("--target-flags", "").split(" ").filter((flag) => flag !== "");

/** What the load generator reports: wall-clock times (`Date.now()`) and closing delays. */
interface AttackReport {
  started: number;
  opened: number;
  firstClose: number;
  lastClose: number;
  /** Seconds from each head's first byte to its close by the target. */
  heads: number[];
  /** Seconds from each body's last byte to its close by the target. */
  bodies: number[];
}

/**
 * The load generator (`--attack --port P`): opens the connections, trickles the bodies, waits
 * until the target closed them all (or three timeouts past the last byte) and prints its
 * {@linkcode AttackReport} as JSON on its last line; `opened WALL` once all are open.
 */
async function _attack(port: number): Promise<void> {
  const started = Date.now();
  const closes: { kind: "head" | "body"; at: number; from: number }[] = [];
  const watch = (conn: Deno.Conn, kind: "head" | "body", from: () => number) => {
    (async () => {
      const buffer = new Uint8Array(4096);
      try {
        while (await conn.read(buffer) !== null) { /* the 408 */ }
      } catch { /* reset */ }
      const at = Date.now();
      closes.push({ kind, at, from: (at - from()) / 1000 });
      try {
        conn.close();
      } catch { /* closed */ }
    })();
  };
  const connect = () => Deno.connect({ hostname: "127.0.0.1", port });
  for (let i = 0; i < heads; i++) {
    const conn = await connect();
    await conn.write(_encoder.encode("POST /execute HTTP/1.1\r\nhost: x\r\ncontent-le"));
    const first = Date.now();
    watch(conn, "head", () => first);
  }
  const trickled: { conn: Deno.Conn; last: number }[] = [];
  for (let i = 0; i < bodies; i++) {
    const conn = await connect();
    await conn.write(_encoder.encode(
      "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
        "content-length: 100000\r\n\r\n--b\r\n",
    ));
    const body = { conn, last: Date.now() };
    trickled.push(body);
    watch(conn, "body", () => body.last);
  }
  console.log(`opened ${Date.now()}`);
  const byte = _encoder.encode("x");
  for (let k = 0; k < trickleBytes; k++) {
    await new Promise((resolve) => setTimeout(resolve, trickleSeconds * 1000));
    for (const body of trickled) {
      body.conn.write(byte).then(() => (body.last = Date.now()), () => {});
    }
  }
  const giveUp = Date.now() + 3000 * Math.max(headerTimeout, bodyTimeout);
  while (closes.length < heads + bodies && Date.now() < giveUp) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const at = closes.map((c) => c.at);
  const report: AttackReport = {
    started,
    opened: 0,
    firstClose: Math.min(...at),
    lastClose: Math.max(...at),
    heads: closes.filter((c) => c.kind === "head").map((c) => c.from),
    bodies: closes.filter((c) => c.kind === "body").map((c) => c.from),
  };
  console.log(JSON.stringify(report));
  Deno.exit(0);
}

/** A `kcoral` process under the loop-delay preload, awaited until its stderr shows `ready`. */
async function _spawnMeasured(
  args: string[],
  ready: string,
  delayFile: string,
  tree?: string,
): Promise<Deno.ChildProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--preload",
      _PRELOAD,
      ...targetFlags,
      tree ? `${tree}/cli.ts` : _CLI,
      ...args,
    ],
    cwd: tree,
    env: { KCORAL_LOOP_DELAY_FILE: delayFile },
    stdin: "null",
    stdout: targetFlags.length ? "inherit" : "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  for (let seen = ""; !seen.includes(ready);) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`exited before it was ready:\n${seen}`);
    seen += value;
  }
  (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })().catch(() => {});
  return child;
}

/**
 * The target (a server, or a Router with a node) on `port`; resolves with its process id (the
 * server's, the Router's) and its stop.
 */
async function _startTarget(
  target: string,
  port: number,
  delayFile: string,
  tree?: string,
): Promise<{ pid: number; stop: () => Promise<void> }> {
  const limits = [
    "--header-timeout-seconds",
    String(headerTimeout),
    "--body-timeout-seconds",
    String(bodyTimeout),
    "--max-connections",
    String(heads + bodies + 100),
  ];
  const stop = async (child: Deno.ChildProcess) => {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
    await child.status;
  };
  if (target === "server") {
    const server = await _spawnMeasured(
      [
        "server",
        "--device",
        "cpu",
        "--num-workers",
        "1",
        "--sandbox",
        "none",
        "--port",
        String(port),
        "--log-dir",
        "",
        "--no-log-console",
        "--disk-cache-dir",
        "",
        ...limits,
      ],
      "Application startup complete.",
      delayFile,
      tree,
    );
    return { pid: server.pid, stop: () => stop(server) };
  }
  const router = await _spawnMeasured(
    ["router", "--port", String(port), "--recovery-threshold", "1", ...limits],
    "KCoral router listening",
    delayFile,
    tree,
  );
  const url = `http://127.0.0.1:${port}`;
  const node = await startNodeProcess("cpu", url, 1, tree);
  await waitForCapacity(url, 1);
  return {
    pid: router.pid,
    stop: async () => {
      await node.stop();
      await stop(router);
    },
  };
}

/** One round's figures. */
interface Round {
  tree: string;
  /** `/health` probes: when each began (`Date.now()`) and its ms. */
  probes: [number, number][];
  /** The target's event-loop delay: each 5 ms tick's wall time and lateness (ms). */
  delays: [number, number][];
  /** Of each tick's lateness, the part its main thread ran (its own work, not a CPU wait). */
  own: [number, number][];
  /**
   * CPU samples every 100 ms: wall time, then CPU ms so far of the target process (all its
   * threads), of the load generator, and of the whole machine (busy, of all cores).
   */
  cpu: [number, number, number, number][];
  programOk: boolean;
  attack: AttackReport;
}

async function _round(target: string, label: string, tree?: string): Promise<Round> {
  const port = freePort();
  const delayFile = await Deno.makeTempFile({ prefix: "kcoral-loop-delay-" });
  const { pid, stop: stopTarget } = await _startTarget(target, port, delayFile, tree);
  const url = `http://127.0.0.1:${port}`;
  const probes: [number, number][] = [];
  let probing = true;
  const prober = (async () => {
    while (probing) {
      const at = Date.now();
      const t = performance.now();
      const response = await fetch(`${url}/health`, { headers: { connection: "close" } });
      await response.body?.cancel();
      if (response.status === 200) probes.push([at, performance.now() - t]);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  })();
  const attacker = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      _SELF,
      "--attack",
      "--port",
      String(port),
      ...Deno.args.filter((a) => a !== "--attack"),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const cpu: Round["cpu"] = [];
  let loadCpu = 0;
  const sampler = setInterval(() => {
    try {
      loadCpu = ownCpuMs(attacker.pid);
    } catch { /* the load generator has exited: its last figure stands */ }
    cpu.push([Date.now(), ownCpuMs(pid), loadCpu, _machineBusyMs()]);
  }, 100);
  const lines = attacker.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  let opened = 0;
  const nextLine = async (): Promise<string> => {
    for (;;) {
      const at = out.indexOf("\n");
      if (at >= 0) {
        const line = out.slice(0, at);
        out = out.slice(at + 1);
        return line;
      }
      const { value, done } = await lines.read();
      if (done) throw new Error("the load generator ended early");
      out += value;
    }
  };
  opened = Number((await nextLine()).split(" ")[1]);
  const { body, contentType } = multipartBody([{
    name: "program",
    contentType: "application/json",
    body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
  }]);
  const program = await fetch(`${url}/execute`, {
    method: "POST",
    headers: { "content-type": contentType },
    body: body as Uint8Array<ArrayBuffer>,
  });
  const programOk = program.status === 200 && (await program.json()).status === "COMPLETED";
  const attack: AttackReport = { ...JSON.parse(await nextLine()), opened };
  await attacker.status;
  await new Promise((resolve) => setTimeout(resolve, 1000));
  probing = false;
  await prober;
  clearInterval(sampler);
  await stopTarget();
  const ticks = (await Deno.readTextFile(delayFile)).split("\n").filter((l) => l !== "")
    .map((l) => l.split(" ").map(Number)).filter(([at]) => at >= attack.started);
  const delays = ticks.map(([at, late]) => [at, late] as [number, number]);
  const own = ticks.map(([at, late, ran]) => [at, Math.min(late, ran)] as [number, number]);
  await Deno.remove(delayFile);
  return {
    tree: label,
    probes: probes.filter(([at]) => at >= attack.started),
    delays,
    own,
    cpu,
    programOk,
    attack,
  };
}

/** CPU ms all cores of the machine have been busy (`/proc/stat`, USER_HZ 100). */
function _machineBusyMs(): number {
  const fields = Deno.readTextFileSync("/proc/stat").split("\n")[0].trim().split(/\s+/).slice(1)
    .map(Number);
  const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
  return (total - fields[3] - fields[4]) * 10;
}

/** CPU used within [from, to) as % of one core: the target, the load generator, the machine. */
function _cpuShare(round: Round, from: number, to: number): [number, number, number] {
  const inside = round.cpu.filter(([at]) => at >= from && at < to);
  if (inside.length < 2) return [NaN, NaN, NaN];
  const [first, last] = [inside[0], inside.at(-1)!];
  const wall = last[0] - first[0];
  return [1, 2, 3].map((i) => 100 * (last[i] - first[i]) / wall) as [number, number, number];
}

function _quantile(sorted: number[], q: number): number {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : NaN;
}

/** p50, p99 and max of the samples taken within [from, to). */
function _phase(samples: [number, number][], from: number, to: number) {
  const ms = samples.filter(([at]) => at >= from && at < to).map(([, ms]) => ms)
    .sort((a, b) => a - b);
  return { n: ms.length, p50: _quantile(ms, 0.5), p99: _quantile(ms, 0.99), max: ms.at(-1) ?? NaN };
}

function _phases(round: Round): [string, number, number][] {
  const a = round.attack;
  return [
    ["all", -Infinity, Infinity],
    ["opening them", a.started, a.opened],
    ["all stalled", a.opened, a.firstClose],
    ["the target cutting them", a.firstClose, a.lastClose],
    ["after", a.lastClose, Infinity],
  ];
}

const _f = (n: number) => Number.isNaN(n) ? "n/a" : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2);

/** The figures of one phase: `/health`'s, and the target's loop delay (all of it, its own). */
function _figures(round: Round, from: number, to: number) {
  return {
    health: _phase(round.probes, from, to),
    delay: _phase(round.delays, from, to),
    own: _phase(round.own, from, to),
  };
}

function _report(target: string, round: Round): void {
  const a = round.attack;
  console.log(`\n${target}, ${round.tree}:\n`);
  console.log(
    "| phase | `/health` answers | `/health` ms p50 / p99 / max | target's loop delay ms " +
      "p99 / max | of it, the target running ms p99 / max | CPU % of a core: target / load " +
      `generator / machine (of ${100 * navigator.hardwareConcurrency}) |`,
  );
  console.log("|---|---|---|---|---|---|");
  for (const [name, from, to] of _phases(round)) {
    const { health: h, delay: d, own: o } = _figures(round, from, to);
    const [cpuTarget, cpuLoad, cpuMachine] = _cpuShare(round, from, to);
    const span = Number.isFinite(from) && Number.isFinite(to)
      ? ` (${((to - from) / 1000).toFixed(1)} s)`
      : "";
    console.log(
      `| ${name}${span} | ${h.n} | ${_f(h.p50)} / ${_f(h.p99)} / ${_f(h.max)} | ` +
        `${_f(d.p99)} / ${_f(d.max)} | ${_f(o.p99)} / ${_f(o.max)} | ` +
        `${cpuTarget.toFixed(0)} / ${cpuLoad.toFixed(0)} / ${cpuMachine.toFixed(0)} |`,
    );
  }
  console.log(`\nnormal program completed: ${round.programOk}`);
  for (
    const [kind, closed, of, timeout, from] of [
      ["heads", a.heads, heads, headerTimeout, "first"],
      ["bodies", a.bodies, bodies, bodyTimeout, "last"],
    ] as const
  ) {
    const sorted = [...closed].sort((x, y) => x - y);
    console.log(
      `${kind} closed by the target: ${closed.length} of ${of}, ${_f(sorted[0])}–${
        _f(sorted.at(-1) ?? NaN)
      } s after their ${from} byte (timeout ${timeout} s)`,
    );
  }
}

/** Each tree's median over its rounds of each phase's p99s and the maxima. */
function _summary(target: string, trees: string[], results: Round[]): void {
  const median = (xs: number[]) => {
    const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
    return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : NaN;
  };
  const rounds = results.length / trees.length;
  console.log(`\n${target}, medians of ${rounds} rounds per tree (each round's in brackets):\n`);
  console.log(`| figure | ${trees.join(" | ")} |`);
  console.log(`|---|${trees.map(() => "---|").join("")}`);
  const names = _phases(results[0]).map(([name]) => name);
  const rows: [string, (round: Round) => number][] = [];
  const at = (round: Round, name: string) => {
    const [, from, to] = _phases(round).find(([n]) => n === name)!;
    return _figures(round, from, to);
  };
  for (const name of names) {
    rows.push([`\`/health\` p99 ms, ${name}`, (r) => at(r, name).health.p99]);
  }
  rows.push(["`/health` max ms, all", (r) => at(r, "all").health.max]);
  for (const name of names) {
    rows.push([`target's loop delay p99 ms, ${name}`, (r) => at(r, name).delay.p99]);
  }
  rows.push(["target's loop delay max ms, all", (r) => at(r, "all").delay.max]);
  for (const name of names) {
    rows.push([`of it running, p99 ms, ${name}`, (r) => at(r, name).own.p99]);
  }
  rows.push(["of it running, max ms, all", (r) => at(r, "all").own.max]);
  for (const [name, of] of rows) {
    const cells = trees.map((label) => {
      const values = results.filter((r) => r.tree === label).map(of);
      return `${_f(median(values))} (${values.map(_f).join(", ")})`;
    });
    console.log(`| ${name} | ${cells.join(" | ")} |`);
  }
}

if (Deno.args.includes("--attack")) {
  await _attack(_arg("--port", 0));
} else {
  const target = _text("--target", "server");
  if (target !== "server" && target !== "router") throw new Error("--target server|router");
  const before = _text("--before", "");
  const rounds = _arg("--rounds", 1);
  const trees: [string, string | undefined][] = before
    ? [["before", before], ["this tree", undefined]]
    : [["this tree", undefined]];
  const results: Round[] = [];
  for (let r = 0; r < rounds; r++) {
    for (const [label, tree] of r % 2 ? [...trees].reverse() : trees) {
      const round = await _round(target, `${label}, round ${r + 1}`, tree);
      round.tree = label;
      _report(target, { ...round, tree: `${label}, round ${r + 1}` });
      results.push(round);
    }
  }
  const raw = _text("--raw", "");
  if (raw) await Deno.writeTextFile(raw, JSON.stringify(results));
  if (results.length > 1) _summary(target, trees.map(([label]) => label), results);
}
