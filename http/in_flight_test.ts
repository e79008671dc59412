import { EventLog } from "./events.ts";
import { InFlight } from "./in_flight.ts";

Deno.test("in_flight: InFlight", async () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const inFlight = new InFlight(events);
  inFlight.enter();
  const drained = inFlight.drain(); // shutdown_started {remaining: 1}
  if (!inFlight.closing) throw new Error();
  inFlight.leave(); // shutdown_waiting {remaining: 0}
  await drained;
});
