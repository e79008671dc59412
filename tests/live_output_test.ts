/**
 * Live output (docs/live-output.md): chunks arrive while the program runs, through the server
 * and through a Router; the final answer is the one the request gets without the header; a
 * request without the header gets today's answer; limits and truncation flags as in the result.
 */
import assert from "node:assert/strict";
import { Client, type OutputChunk, Program, type ProgramResult } from "../mod.ts";
import {
  isLiveOutput,
  LIVE_OUTPUT_CONTENT_TYPE,
  LiveOutputReader,
} from "../protocol/live_output.ts";
import { callProgram, multipartBody, startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";

/**
 * A program that prints, then goes on only once the file `go` exists (the client makes it when
 * the first chunk reaches it), then prints again. Without live output it would wait its 20 s out
 * and say so.
 */
function source(go: string): string {
  return [
    "import os, sys, time",
    "def f():",
    "    print('first', flush=True)",
    "    for _ in range(400):",
    `        if os.path.exists(${JSON.stringify(go)}):`,
    "            break",
    "        time.sleep(0.05)",
    "    else:",
    "        print('never released', flush=True)",
    "    print('second', flush=True)",
    "    print('to stderr', file=sys.stderr, flush=True)",
    "    return 7",
    "",
  ].join("\n");
}

function program(text: string): Program {
  const p = new Program();
  const m = p.upload({ kind: "module", source: text });
  const fn = p.getFunction({ module: m, name: "f" });
  p.return_({ key: "out", value: p.run({ fn, args: [] }) });
  return p;
}

/** A result without what differs from run to run (request id, timings). */
function comparable(result: ProgramResult): Record<string, unknown> {
  return {
    status: result.status,
    stdout: result.stdout,
    stderr: result.stderr,
    stdoutTruncated: result.stdoutTruncated,
    stderrTruncated: result.stderrTruncated,
    error: result.error,
    out: result.get("out"),
  };
}

/**
 * Runs the program with live output, making `go` once a chunk with "first" arrives: the chunks
 * and the result.
 */
async function streamed(url: string, go: string, options: { transport?: "fetch" } = {}) {
  await using client = new Client(url, options);
  const chunks: OutputChunk[] = [];
  const result = await client.execute(program(source(go)), {
    timeoutSeconds: 30,
    onOutput: (chunk) => {
      chunks.push(chunk);
      if (chunk.data.includes("first")) Deno.writeTextFileSync(go, "");
    },
  });
  return { chunks, result };
}

async function checkStreamed(url: string, options: { transport?: "fetch" } = {}) {
  const dir = await Deno.makeTempDir();
  const go = `${dir}/go`;
  try {
    const { chunks, result } = await streamed(url, go, options);
    const first = chunks.find((c) => c.data.includes("first"));
    assert.ok(first, `no chunk with "first": ${JSON.stringify(chunks)}`);
    assert.ok(!first.data.includes("second"));
    // The program went on only after the client had its first chunk ("never released"
    // otherwise): that chunk came while it ran.
    assert.equal(result.stdout, "first\nsecond\n");
    const joined = (stream: string) =>
      chunks.filter((c) => c.stream === stream).map((c) => c.data).join("");
    assert.equal(joined("stdout"), "first\nsecond\n");
    assert.equal(joined("stderr"), "to stderr\n");
    await using plain = new Client(url, options);
    const reference = await plain.execute(program(source(go)), { timeoutSeconds: 30 });
    assert.deepEqual(comparable(result), comparable(reference));
    assert.equal(result.get("out"), 7);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("live output: chunks before the end, the same result (server, both transports)", async () => {
  const server = await startServer();
  try {
    await checkStreamed(server.url);
    await checkStreamed(server.url, { transport: "fetch" });
  } finally {
    await server.stop();
  }
});

Deno.test("live output: the wire, and no change without the header", async () => {
  const server = await startServer();
  try {
    const source = "def f():\n    print('x' * 50)\n    return 1\n";
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify({ ...callProgram(source, "f"), options: { output_limit_bytes: 20 } }),
    }]);
    const post = (headers: Record<string, string>) =>
      fetch(`${server.url}/execute`, {
        method: "POST",
        body,
        headers: { "content-type": contentType, ...headers },
      });

    const plain = await post({});
    assert.equal(plain.status, 200);
    assert.equal(plain.headers.get("content-type"), "application/json");
    assert.equal(plain.headers.get("x-kcoral-stream"), null);
    const plainBytes = new Uint8Array(await plain.arrayBuffer());
    assert.equal(plain.headers.get("content-length"), String(plainBytes.length));
    const plainJson = JSON.parse(new TextDecoder().decode(plainBytes));

    const live = await post({ "X-KCoral-Stream": "output" });
    assert.equal(live.status, 200);
    assert.equal(live.headers.get("content-type"), LIVE_OUTPUT_CONTENT_TYPE);
    const chunks: OutputChunk[] = [];
    const reader = new LiveOutputReader((chunk) => chunks.push(chunk));
    reader.push(new Uint8Array(await live.arrayBuffer()));
    const final = reader.finish();
    assert.equal(final.status, 200);
    assert.equal(final.headers.get("content-type"), "application/json");
    const liveJson = JSON.parse(new TextDecoder().decode(final.body));
    // The limit holds for the chunks too: they never carry more than the result.
    assert.equal(chunks.map((c) => c.data).join(""), "x".repeat(20));
    assert.equal(liveJson.stdout, "x".repeat(20));
    assert.equal(liveJson.stdout_truncated, true);
    for (const key of ["request_id", "queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"]) {
      delete plainJson[key];
      delete liveJson[key];
    }
    assert.deepEqual(liveJson, plainJson);
    // The same byte length as today's answer (timings aside, the body is the same JSON).
    assert.ok(Math.abs(final.body.length - plainBytes.length) < 16);

    // Turned away before a worker: the ordinary answer, header or not.
    const bad = await fetch(`${server.url}/execute`, {
      method: "POST",
      body: "not multipart",
      headers: { "content-type": "text/plain", "X-KCoral-Stream": "output" },
    });
    assert.equal(bad.status, 400);
    assert.ok(!isLiveOutput(bad.headers.get("content-type")));
    await bad.body?.cancel();
  } finally {
    await server.stop();
  }
});

Deno.test("live output: through a Router", async () => {
  const router = await startRouter();
  let node: Awaited<ReturnType<typeof startNode>> | undefined;
  try {
    node = await startNode(router.url, "live-output");
    await waitForCapacity(router.url, 1);
    await checkStreamed(router.url);
  } finally {
    await node?.stop();
    await router.stop();
  }
});
