import { TunnelledRequest } from "./tunnelled_request.ts";

Deno.test("tunnelled request: TunnelledRequest", async () => {
  const request = new TunnelledRequest("0f6c2b4e-1111-4222-8333-444455556666", null);
  const input = request.input({ headers: [["content-length", "2"]], content_length: 2 }, "http");
  if (input instanceof Request) throw new Error("a small body is taken whole");
  request.body.receive(new Uint8Array([7, 8]), true);
  if ((await input.bytes()).length !== 2) throw new Error();
});

Deno.test("tunnelled request: TunnelledRequest.input", () => {
  const request = new TunnelledRequest("0f6c2b4e-1111-4222-8333-444455556666", null);
  const input = request.input({ headers: [], content_length: null }, "https");
  if (!(input instanceof Request) || input.url !== "https://kcoral-tunnel/execute") {
    throw new Error();
  }
});

Deno.test("tunnelled request: TunnelledRequest.credit", () => {
  const request = new TunnelledRequest("0f6c2b4e-1111-4222-8333-444455556666", null);
  try {
    request.credit(1);
    throw new Error("accepted");
  } catch (error) {
    if (!(error instanceof Error) || error.name !== "LinkMessageError") throw error;
  }
});

Deno.test("tunnelled request: TunnelledRequest.answer", async () => {
  const request = new TunnelledRequest("0f6c2b4e-1111-4222-8333-444455556666", null);
  if (!(await request.answer(new Response("ok")))) throw new Error();
});

Deno.test("tunnelled request: TunnelledRequest.fail", () => {
  const request = new TunnelledRequest("0f6c2b4e-1111-4222-8333-444455556666", null);
  request.fail("client_disconnected");
  if (!request.abort.signal.aborted) throw new Error();
});
