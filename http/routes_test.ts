import { jsonResponse, peerHost, route } from "./routes.ts";

Deno.test("routes: route", async () => {
  const routes = [{ path: "/health", methods: ["GET"], handler: () => new Response("ok") }];
  const ok = await route(routes, new Request("http://x/health"), undefined);
  const missing = await route(routes, new Request("http://x/nope"), undefined);
  const wrong = await route(routes, new Request("http://x/health", { method: "POST" }), undefined);
  if (ok.status !== 200 || missing.status !== 404 || wrong.status !== 405) throw new Error();
});

Deno.test("routes: jsonResponse", () => {
  const response = jsonResponse(200, '{"status":"ok"}');
  if (response.headers.get("content-type") !== "application/json") throw new Error();
});

Deno.test("routes: peerHost", () => {
  const info = { remoteAddr: { transport: "tcp", hostname: "10.0.0.7", port: 5 } };
  if (peerHost(info as Deno.ServeHandlerInfo) !== "10.0.0.7") throw new Error();
});
