import { BodyReceiver } from "./body_receiver.ts";
import { CREDIT_WINDOW } from "./messages.ts";

Deno.test("body receiver: BodyReceiver", async () => {
  const grants: number[] = [];
  const receiver = new BodyReceiver((n) => grants.push(n));
  for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(new Uint8Array([i]));
  const reader = receiver.stream.getReader();
  for (let i = 0; i < CREDIT_WINDOW / 2; i++) await reader.read();
  // Half the window read: that much credit goes back.
  if (grants.join() !== String(CREDIT_WINDOW / 2)) throw new Error(grants.join());
  receiver.end();
  let rest = 0;
  while (!(await reader.read()).done) rest++;
  if (rest !== CREDIT_WINDOW / 2) throw new Error();
});
