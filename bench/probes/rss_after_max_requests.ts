/**
 * The server's resident memory around max-size requests (`--max-request-bytes` 256 MiB): for 1,
 * 4 and 8 concurrent uploads of a 255 MiB `bytes` value (the most that fits in a 256 MiB body
 * with its program), 4 concurrent 255 MiB results, and 10 rounds of 4 concurrent uploads, each
 * on a fresh server: RSS idle before, at peak (the kernel's high-water mark, `VmHWM`, reset
 * before the requests) and after 10, 30 and 60 s idle, with the memory cache's bytes on
 * `/dev/shm` beside it. CPU server, reused workers, no sandbox, memory cache off (its contents
 * are bounded by `--cache-capacity-bytes` and are not the process's memory), disk cache off.
 *
 *   deno run -A bench/probes/rss_after_max_requests.ts [--idle 10,30,60] [--rounds 10]
 *     [--rows up1,up4,up8,down4,rep]
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { rssMiB } from "../_proc.ts";
import { lengthProgram, randomBytes } from "../_programs.ts";
import { startServerProcess } from "./_probe.ts";

const _PAYLOAD = 255 * 1024 * 1024;

function _arg(name: string, fallback: string): string {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Deno.args[at + 1] : fallback;
}

const idleMarks = _arg("--idle", "10,30,60").split(",").map(Number);
const rows = _arg("--rows", "up1,up4,up8,down4,rep").split(",");
const rounds = Number(_arg("--rounds", "10"));

/** A program returning `bytes` of `n` bytes. */
function resultProgram(n: number): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: "def make(n):\n    return bytes(n)\n" });
  const fn = program.getFunction({ module: mod, name: "make" });
  program.return_({ key: "b", value: program.run({ fn, args: [n] }) });
  return program;
}

/** `VmHWM` (peak RSS) of `pid` in MiB. */
function peakMiB(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/VmHWM:\s+(\d+)/.exec(status)![1]) / 1024;
}

/** Resets `pid`'s `VmHWM` to its current RSS. */
function resetPeak(pid: number): void {
  Deno.writeTextFileSync(`/proc/${pid}/clear_refs`, "5");
}

/** The memory cache directories on `/dev/shm` (one per server). */
function shmCacheDirs(): Set<string> {
  try {
    return new Set(
      [...Deno.readDirSync("/dev/shm")]
        .filter((e) => e.isDirectory && e.name.startsWith("kcoral-blobs-"))
        .map((e) => `/dev/shm/${e.name}`),
    );
  } catch {
    return new Set();
  }
}

/** Bytes in `dirs`, in MiB. */
function dirsMiB(dirs: string[]): number {
  let bytes = 0;
  for (const dir of dirs) {
    try {
      for (const file of Deno.readDirSync(dir)) bytes += Deno.statSync(`${dir}/${file.name}`).size;
    } catch { /* gone */ }
  }
  return bytes / (1 << 20);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Row {
  label: string;
  before: number;
  peak: number;
  after: number[];
  shm: number;
  seconds: number;
}

async function measure(
  label: string,
  rounds: number,
  concurrent: number,
  program: (slot: number, round: number) => Program,
  check: (result: Awaited<ReturnType<Client["execute"]>>) => boolean,
): Promise<Row> {
  const older = shmCacheDirs();
  const server = await startServerProcess([
    "--device",
    "cpu",
    "--num-workers",
    String(concurrent),
    "--max-requests-per-worker",
    "0",
    "--cache-capacity-bytes",
    "0",
    "--disk-cache-dir",
    "",
    "--log-dir",
    "",
  ]);
  const pid = server.child.pid;
  const cacheDirs = [...shmCacheDirs()].filter((dir) => !older.has(dir));
  try {
    await sleep(2000);
    const before = rssMiB(pid);
    resetPeak(pid);
    const start = performance.now();
    const clients = Array.from({ length: concurrent }, () => new Client(server.url));
    for (let round = 0; round < rounds; round++) {
      const programs = clients.map((_, slot) => program(slot, round));
      await Promise.all(clients.map(async (client, slot) => {
        const result = await client.execute(programs[slot]);
        if (!check(result)) throw new Error(`${label}: ${JSON.stringify(result.error)}`);
      }));
    }
    for (const client of clients) client.close();
    const seconds = (performance.now() - start) / 1000;
    const peak = peakMiB(pid);
    const after: number[] = [];
    const idleStart = performance.now();
    for (const mark of idleMarks) {
      await sleep(Math.max(0, idleStart + mark * 1000 - performance.now()));
      after.push(rssMiB(pid));
    }
    return { label, before, peak, after, shm: dirsMiB(cacheDirs), seconds };
  } finally {
    await server.stop();
  }
}

const payloads: Uint8Array[] = [];
/** A payload per concurrent slot, its first bytes changed per round so every upload is new. */
function payload(slot: number, round: number): Uint8Array {
  payloads[slot] ??= randomBytes(_PAYLOAD);
  new DataView(payloads[slot].buffer).setFloat64(0, Math.random() + round);
  return payloads[slot];
}
const uploaded = (result: Awaited<ReturnType<Client["execute"]>>) => result.get("n") === _PAYLOAD;
const downloaded = (result: Awaited<ReturnType<Client["execute"]>>) =>
  (result.get("b") as Uint8Array | undefined)?.length === _PAYLOAD;

const results: Row[] = [];
for (const row of rows) {
  const n = Number(row.replace(/^\D+/, ""));
  // Payloads are made before the server starts (making one takes a while).
  const slots = row.startsWith("up") ? n : row === "rep" ? 4 : 0;
  for (let slot = 0; slot < slots; slot++) payload(slot, 0);
  if (row.startsWith("up")) {
    results.push(
      await measure(
        `${n} × 255 MiB upload`,
        1,
        n,
        (s, r) => lengthProgram(payload(s, r)),
        uploaded,
      ),
    );
  } else if (row.startsWith("down")) {
    results.push(
      await measure(`${n} × 255 MiB result`, 1, n, () => resultProgram(_PAYLOAD), downloaded),
    );
  } else if (row === "rep") {
    results.push(
      await measure(
        `${rounds} rounds × 4 × 255 MiB upload`,
        rounds,
        4,
        (s, r) => lengthProgram(payload(s, r)),
        uploaded,
      ),
    );
  }
  console.error(JSON.stringify(results.at(-1)));
}

console.log(
  `RSS of \`kcoral server --device cpu\` (MiB), ${new Date().toISOString().slice(0, 10)}, ` +
    `${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno}`,
);
console.log("");
console.log(
  `| requests | idle before | peak | ${
    idleMarks.map((s) => `after ${s} s idle`).join(" | ")
  } | cache on /dev/shm | requests took |`,
);
console.log(`|---|---:|---:|${idleMarks.map(() => "---:|").join("")}---:|---:|`);
for (const r of results) {
  console.log(
    `| ${r.label} | ${r.before.toFixed(0)} | ${r.peak.toFixed(0)} | ${
      r.after.map((x) => x.toFixed(0)).join(" | ")
    } | ${r.shm.toFixed(0)} | ${r.seconds.toFixed(1)} s |`,
  );
}
