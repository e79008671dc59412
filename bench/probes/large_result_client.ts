/**
 * A cached 64 MiB `c = a + b` through the client's own HTTP/1.1 agent alone (no `Client`) and
 * through `Client.execute`, alternating, against one server in its own process (8 workers).
 *
 *   deno run -A bench/probes/large_result_client.ts [gpu]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { Http1Agent } from "../../client/transport/http1_agent.ts";
import { RESULT_FACTORIES } from "../../client/result.ts";
import { PartDigests } from "../../protocol/part_digests.ts";
import { HashThread } from "../../protocol/hash_threads.ts";
import { encodeMultipartChunks } from "../../protocol/multipart_encode.ts";
import { decodeProgramResult, decodeResponseBody } from "../../protocol/response_decode.ts";
import { median, randomAddProgram, startReusedServer } from "./_probe.ts";

const server = await startReusedServer(8, { gpu: Deno.args.includes("gpu") });
const program = randomAddProgram();
const client = new Client(server.url);
await client.execute(program);
const { port } = new URL(server.url);
const agent = new Http1Agent({
  hostname: "127.0.0.1",
  port: Number(port),
  host: `127.0.0.1:${port}`,
  connectTimeoutMs: null,
});
const thread = new HashThread();
const programBytes = new TextEncoder().encode(program.toJson({}));

async function raw() {
  const encoded = encodeMultipartChunks([
    { name: "program", contentType: "application/json", body: programBytes },
  ]);
  let digests: PartDigests | undefined;
  const response = await agent.request(
    "POST",
    "/execute",
    new Headers({ "content-type": encoded.contentType }),
    [...encoded.chunks],
    (headers) => {
      digests = PartDigests.forMultipart(headers, thread)!;
      return { pad: (x) => digests!.pad(x), update: (b, r) => digests!.update(b, r) };
    },
  );
  await digests!.settle();
  const decoded = decodeResponseBody(response.headers.get("content-type"), response.body, {
    marks: digests!.marksFor(response.body),
  });
  return decodeProgramResult(
    decoded.body,
    decoded.parts,
    RESULT_FACTORIES,
    (x) => digests?.lookup(x),
  );
}

const rawMs: number[] = [];
const clientMs: number[] = [];
for (let k = 0; k < 8; k++) {
  let start = performance.now();
  await raw();
  rawMs.push(performance.now() - start);
  start = performance.now();
  await client.execute(program);
  clientMs.push(performance.now() - start);
}
const list = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(",");
console.log(
  `raw agent ${median(rawMs).toFixed(1)} [${list(rawMs)}] | Client.execute ${
    median(clientMs).toFixed(1)
  } [${list(clientMs)}]`,
);
agent.close();
thread.close();
client.close();
await server.stop();
