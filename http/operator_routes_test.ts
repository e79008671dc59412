import { Registry } from "prom-client";
import { operatorRoutes } from "./operator_routes.ts";
import { route } from "./routes.ts";

Deno.test("operator_routes: @module", async () => {
  const routes = operatorRoutes(new Registry(), () => ({ kind: "server" }));
  const data = await route(routes, new Request("http://x/status/data"), undefined);
  if ((await data.json()).kind !== "server") throw new Error();
});
