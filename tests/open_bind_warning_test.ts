/**
 * `kcoral server` and `kcoral router` warn once at start when they listen beyond loopback without
 * client tokens, and stay quiet on loopback or with a token.
 */
import assert from "node:assert/strict";
import { freePort, KcoralProcess } from "./_router.ts";

const WARNING = /warning: listening on .* without client tokens/;

/** The lines a command printed up to its startup line, then stopped. */
async function startupLines(args: string[], env: Record<string, string> = {}): Promise<string[]> {
  const process = new KcoralProcess(args, env);
  try {
    await process.waitForLine(/Application startup complete\./, 60_000);
    return [...process.lines];
  } finally {
    await process.stop();
  }
}

const server = (host: string) => [
  "server",
  "--device",
  "cpu",
  "--sandbox",
  "none",
  "--num-workers",
  "1",
  "--host",
  host,
  "--port",
  String(freePort()),
  "--log-dir",
  "",
];

Deno.test("open bind: a server on 0.0.0.0 without tokens warns, with a token or on loopback not", async () => {
  const open = await startupLines(server("0.0.0.0"));
  assert.equal(open.filter((line) => WARNING.test(line)).length, 1, open.join("\n"));
  assert.ok(open.some((line) => line.includes("KCORAL_CLIENT_TOKEN")), open.join("\n"));
  const token = await startupLines(server("0.0.0.0"), { KCORAL_CLIENT_TOKEN: "s3cret" });
  assert.ok(!token.some((line) => WARNING.test(line)), token.join("\n"));
  const loopback = await startupLines(server("127.0.0.1"));
  assert.ok(!loopback.some((line) => WARNING.test(line)), loopback.join("\n"));
});

Deno.test("open bind: a Router on 0.0.0.0 without tokens warns", async () => {
  const lines = await startupLines(["router", "--host", "0.0.0.0", "--port", String(freePort())]);
  assert.equal(lines.filter((line) => WARNING.test(line)).length, 1, lines.join("\n"));
});
