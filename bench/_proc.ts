/** Process figures from /proc for the benchmarks and probes (Linux). */

const _TICK_MS = 10; // ms per clock tick (USER_HZ 100)

/** CPU ms (user + system) of `root` and of all its descendants, from /proc. */
export function processCpuMs(root: number): { own: number; below: number } {
  const parents = new Map<number, number>();
  const cpu = new Map<number, number>();
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      parents.set(Number(entry.name), Number(fields[1]));
      cpu.set(Number(entry.name), (Number(fields[11]) + Number(fields[12])) * _TICK_MS);
    } catch { /* gone */ }
  }
  let below = 0;
  for (const [pid, ms] of cpu) {
    for (let up = parents.get(pid); up !== undefined && up > 1; up = parents.get(up)) {
      if (up === root) {
        below += ms;
        break;
      }
    }
  }
  return { own: cpu.get(root) ?? 0, below };
}

/** CPU ms (user + system) of `pid` alone. */
export function ownCpuMs(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * _TICK_MS;
}

/** The first child of `pid` (e.g. a supervisor's server), or `null`. */
export function childPid(pid: number): number | null {
  try {
    const children = Deno.readTextFileSync(`/proc/${pid}/task/${pid}/children`).trim();
    return children ? Number(children.split(" ")[0]) : null;
  } catch {
    return null;
  }
}

/** Resident memory of `pid`, in MiB. */
export function rssMiB(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}
