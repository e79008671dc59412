/**
 * A child process fed on its stdin, for the tests.
 *
 * @module
 */

/** Runs `command ARGS` with `input` on its stdin, closed after it; its whole output. */
export async function outputWithInput(
  command: string | URL,
  args: string[],
  input: Uint8Array | string,
): Promise<Deno.CommandOutput> {
  const child = new Deno.Command(command, {
    args,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(typeof input === "string" ? new TextEncoder().encode(input) : input);
  await writer.close();
  return await child.output();
}
