import { closeConnection } from "./http1_connection.ts";

Deno.test("http1_connection: closeConnection", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conn = await Deno.connect({
    hostname: "127.0.0.1",
    port: (listener.addr as Deno.NetAddr).port,
  });
  closeConnection(conn);
  closeConnection(conn); // no error
  listener.close();
});
