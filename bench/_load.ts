/** Load shared by the server bench and the diagnostic probes. */
import { Client, type ClientOptions, type Program } from "../mod.ts";

/**
 * `clients` closed-loop clients, each sending `program` again as soon as it is answered, for
 * `seconds`: requests per second, and how many were answered.
 */
export async function closedLoop(
  url: string,
  program: Program,
  clients: number,
  seconds: number,
  options: ClientOptions = {},
): Promise<{ rate: number; done: number }> {
  const deadline = performance.now() + seconds * 1000;
  let done = 0;
  const start = performance.now();
  await Promise.all(Array.from({ length: clients }, async () => {
    await using client = new Client(url, options);
    while (performance.now() < deadline) {
      const result = await client.execute(program);
      if (!result.completed) throw new Error(`failed: ${JSON.stringify(result.error)}`);
      done++;
    }
  }));
  return { rate: done / ((performance.now() - start) / 1000), done };
}
