import { serveHttp1 } from "./http1_server.ts";

Deno.test("http1_server: serveHttp1", async () => {
  const server = serveHttp1({
    hostname: "127.0.0.1",
    port: 0,
    handler: (request) => Promise.resolve(new Response(`hello ${new URL(request.url).pathname}`)),
  });
  const response = await fetch(`http://127.0.0.1:${server.addr.port}/x`);
  if ((await response.text()) !== "hello /x") throw new Error();
  await server.shutdown();
});
