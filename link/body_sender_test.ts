import { BodySender } from "./body_sender.ts";
import { decodeResponseFrame } from "./frames.ts";

Deno.test("body sender: BodySender", async () => {
  const frames: string[] = [];
  const id = "0f6c2b4e-1111-4222-8333-444455556666";
  const sender = new BodySender(id, { status: 200, headers: [] }, (frame) => {
    const { head, bytes, end } = decodeResponseFrame(frame);
    frames.push(`${head ? "head+" : ""}${bytes.length}${end ? "+end" : ""}`);
  });
  await sender.write(new Uint8Array(300_000));
  await sender.end();
  if (frames.join() !== "head+262144,37856+end") throw new Error(frames.join());
});
