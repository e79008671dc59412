import { serveHttp1 } from "./http1_server.ts";
import { protocolSwitchOf, switchingHead, switchProtocols } from "./http1_switch.ts";

Deno.test("http1_switch: switchProtocols", async () => {
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: () =>
      Promise.resolve(
        switchProtocols([["upgrade", "echo"], ["connection", "upgrade"]], ({ conn }) => {
          conn.write(new TextEncoder().encode("switched")).finally(() => conn.close());
        }),
      ),
  });
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  await conn.write(new TextEncoder().encode(
    "GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n",
  ));
  let text = "";
  const buffer = new Uint8Array(1024);
  for (let n; (n = await conn.read(buffer)) !== null;) {
    text += new TextDecoder().decode(buffer.subarray(0, n));
  }
  conn.close();
  if (!text.startsWith("HTTP/1.1 101 ") || !text.endsWith("\r\n\r\nswitched")) {
    throw new Error(text);
  }
  await server.shutdown();
});

Deno.test("http1_switch: protocolSwitchOf", () => {
  if (protocolSwitchOf(switchProtocols([], () => {}))?.fields.length !== 0) throw new Error();
  if (protocolSwitchOf(new Response("plain")) !== undefined) throw new Error();
});

Deno.test("http1_switch: switchingHead", () => {
  const head = new TextDecoder().decode(switchingHead([["upgrade", "websocket"]]));
  if (!head.startsWith("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n")) {
    throw new Error();
  }
});
