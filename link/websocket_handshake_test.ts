import { acceptKey, websocketAccept, WebSocketHandshakeError } from "./websocket_handshake.ts";

Deno.test("websocket handshake: WebSocketHandshakeError", () => {
  if (new WebSocketHandshakeError("no key").status !== 400) throw new Error();
});

Deno.test("websocket handshake: acceptKey", () => {
  // RFC 6455 §1.3's example.
  if (acceptKey("dGhlIHNhbXBsZSBub25jZQ==") !== "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") throw new Error();
});

Deno.test("websocket handshake: websocketAccept", () => {
  const request = new Request("http://router/kcoral/v1/slot", {
    headers: {
      upgrade: "websocket",
      connection: "Upgrade",
      "sec-websocket-version": "13",
      "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    },
  });
  // RFC 6455 §1.3's example.
  if (websocketAccept(request) !== "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") throw new Error();
});
