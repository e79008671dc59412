/**
 * Receiving a 128 MiB request body through `Deno.serve` with a BYOB reader into one reused buffer
 * (nothing else: no scanning, no hashing), with `request.bytes()` (`bytes`), or with a default
 * reader that counts the chunks Deno hands over (`chunks`), the client a raw socket in the same
 * process; compare with `loopback.ts` (the same bytes over a bare socket). The server bench
 * prints the BYOB median as a floor row.
 *
 *   deno run -A bench/probes/serve_body.ts [bytes|chunks]
 *
 * @module
 */
import { type BodyRead, byobRead, FLOOR_BYTES, serveBodyTransfers } from "../_floors.ts";
import { randomBytes } from "../_programs.ts";

const bytesRead: BodyRead = async (request, size) => {
  const body = await request.bytes();
  if (body.length !== size) throw new Error(`got ${body.length} bytes`);
  return 1;
};
const chunksRead: BodyRead = async (request, size) => {
  let reads = 0;
  let got = 0;
  for await (const chunk of request.body!) {
    reads++;
    got += chunk.length;
  }
  if (got !== size) throw new Error(`got ${got} bytes`);
  return reads;
};
const read = Deno.args.includes("bytes")
  ? bytesRead
  : Deno.args.includes("chunks")
  ? chunksRead
  : byobRead();
const { ms, reads } = await serveBodyTransfers(randomBytes(FLOOR_BYTES), 4, read);
ms.forEach((total, k) => {
  console.log(
    `total ${total.toFixed(1)} ms | server reads ${reads[k]} (${
      (FLOOR_BYTES / reads[k] / 1024).toFixed(0)
    } KiB avg)`,
  );
});
