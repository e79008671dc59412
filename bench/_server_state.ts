/**
 * What a bench reads of a running server besides its answers: the event log of its latest run,
 * and whether it is idle (every seat ready, nothing running or waiting).
 *
 * @module
 */

/** The events of the latest run under `logDir` (`<logDir>/runs/<run>/events.jsonl`). */
export async function readEvents(logDir: string): Promise<Record<string, unknown>[]> {
  const runs = [...Deno.readDirSync(`${logDir}/runs`)].map((e) => e.name).sort();
  const text = await Deno.readTextFile(`${logDir}/runs/${runs.at(-1)}/events.jsonl`);
  return text.trim().split("\n").map((line) => JSON.parse(line));
}

/**
 * Waits until `/health` reports `seats` ready workers and nothing in progress or waiting (the
 * previous fresh worker torn down, its replacement's context created).
 */
export async function waitIdle(url: string, seats: number, timeoutMs = 60_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const load = (await (await fetch(`${url}/health`)).json()).load ?? {};
    if (
      load.request_capacity === seats && load.requests_in_progress === 0 &&
      load.requests_waiting === 0
    ) {
      return;
    }
    if (performance.now() > deadline) throw new Error(`server not idle: ${JSON.stringify(load)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
