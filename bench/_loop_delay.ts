/**
 * A preload module (`deno run --preload bench/_loop_delay.ts ...`) that measures the event-loop
 * delay of the process it is loaded into: a 5 ms interval timer notes how late each tick ran,
 * and from the main thread's `/proc/thread-self/schedstat` how much of the time since the last
 * tick that thread ran on a CPU and how long it waited, runnable, for one (the machine busy with
 * other processes). Lines `wallMs lateMs ranMs waitedMs` are appended to the file named by
 * `KCORAL_LOOP_DELAY_FILE` every 250 ms (nothing without that variable). A benchmark reads the
 * file to tell the target's own delay (what its `/health` waits behind) from what its load
 * generator and other processes add on a shared machine.
 *
 * @module
 */

const _TICK_MS = 5;
const _file = Deno.env.get("KCORAL_LOOP_DELAY_FILE");

/** Nanoseconds the calling thread ran on a CPU and waited on a run queue (Linux). */
function _schedstat(): [number, number] {
  try {
    const [ran, waited] = Deno.readTextFileSync("/proc/thread-self/schedstat").split(" ");
    return [Number(ran), Number(waited)];
  } catch {
    return [NaN, NaN];
  }
}

if (_file) {
  let last = performance.now();
  let [lastRan, lastWaited] = _schedstat();
  let lines: string[] = [];
  const tick = setInterval(() => {
    const now = performance.now();
    const [ran, waited] = _schedstat();
    lines.push(
      `${Date.now()} ${Math.max(0, now - last - _TICK_MS).toFixed(2)} ` +
        `${((ran - lastRan) / 1e6).toFixed(2)} ${((waited - lastWaited) / 1e6).toFixed(2)}`,
    );
    last = performance.now();
    [lastRan, lastWaited] = _schedstat();
  }, _TICK_MS);
  const flush = setInterval(() => {
    if (lines.length === 0) return;
    Deno.writeTextFileSync(_file, lines.join("\n") + "\n", { append: true });
    lines = [];
  }, 250);
  Deno.unrefTimer(tick);
  Deno.unrefTimer(flush);
}
