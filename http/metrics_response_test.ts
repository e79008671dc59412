import { Counter, Registry } from "prom-client";
import { metricsResponse, registerProcessMetrics } from "./metrics_response.ts";

Deno.test("metrics_response: @module", async () => {
  const registry = new Registry();
  new Counter({ name: "kcoral_example_total", help: "An example.", registers: [registry] }).inc();
  const response = await metricsResponse(registry);
  if (!(await response.text()).includes("kcoral_example_total 1")) throw new Error();
});

Deno.test("metrics_response: registerProcessMetrics", async () => {
  const registry = new Registry();
  registerProcessMetrics(registry, () => ({ python: "3.11.2" }), ["python"]);
  const text = await registry.metrics();
  if (!/kcoral_build_info\{version="[^"]+",deno="[^"]+",python="3.11.2"\} 1/.test(text)) {
    throw new Error(text);
  }
  if (!/^process_open_fds \d+$/m.test(text) || text.includes("nodejs_")) throw new Error(text);
});
