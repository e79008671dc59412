/// <reference lib="dom" />
/**
 * The status pages in a real headless browser (Debian's `chromium`, driven by `puppeteer-core`):
 * a simulated-GPU server's page loads with no console errors and its lease timeline shows a bar
 * for each request that just ran, labelled with its id, never overlapping on a GPU; a Router's
 * page lists its two nodes. Neither page shows program sources or outputs. With
 * `KCORAL_SCREENSHOTS_DIR` set, screenshots of both pages are written there (docs/ has them).
 */
import { KCORAL_VERSION } from "../options/version.ts";
import assert from "node:assert/strict";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { Client, Program } from "../mod.ts";
import type { ServerStatusData } from "../server/status.ts";
import { assertRequestHoldsAlone, startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";

const CHROMIUM = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((path) => {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
});
const SCREENSHOTS = Deno.env.get("KCORAL_SCREENSHOTS_DIR");

async function open(browser: Browser, url: string): Promise<{ page: Page; errors: string[] }> {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const errors: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(message.text());
  });
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("requestfailed", (request) => errors.push(`failed: ${request.url()}`));
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => document.body.dataset.updated !== undefined);
  return { page, errors };
}

function secretProgram(): Program {
  const program = new Program();
  const mod = program.upload({
    kind: "module",
    source:
      "import time\ndef f():\n    print('SECRET-OUTPUT')\n    time.sleep(0.05)\n    return 'SECRET-RESULT'\n",
  });
  program.return_({
    key: "out",
    value: program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [] }),
  });
  return program;
}

Deno.test({
  name: "status page: a simulated-GPU server's lease timeline shows the requests that just ran",
  ignore: CHROMIUM === undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const server = await startServer({
      device: "gpu",
      simulateGpus: true,
      gpus: [0, 1],
      workersPerGpu: 1,
      maxRequestsPerWorker: 0,
    });
    const browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      args: ["--no-sandbox", "--headless=new"],
    });
    try {
      const ids: string[] = [];
      server.app.subscribe((record) => {
        if (record.event === "request_finished" && record.finish_reason === "completed") {
          ids.push(String(record.request_id));
        }
      });
      await using client = new Client(server.url);
      await Promise.all(Array.from({ length: 6 }, () => client.execute(secretProgram())));
      assert.equal(ids.length, 6);

      const { page, errors } = await open(browser, `${server.url}/status`);
      // Wait for a refresh that includes every hold.
      await page.waitForFunction(
        (n: number) => document.querySelectorAll("rect.hold:not(.init)").length >= n,
        {},
        6,
      );
      const holds = await page.$$eval(
        "svg[data-gpu]",
        (svgs) =>
          svgs.flatMap((svg) =>
            [...svg.querySelectorAll("rect.hold:not(.init)")].map((rect) => ({
              gpu: svg.getAttribute("data-gpu"),
              id: rect.getAttribute("data-request"),
              x: Number(rect.getAttribute("x")),
              width: Number(rect.getAttribute("width")),
            }))
          ),
      );
      assert.deepEqual(holds.map((h) => h.id).sort(), [...ids].sort());
      assert.ok(holds.every((h) => h.gpu === "0" || h.gpu === "1"));
      // On each GPU a request's hold never overlaps another hold (a worker's context creation
      // may overlap a retiring worker's teardown: neither is a request).
      const data: ServerStatusData = await (await fetch(`${server.url}/status/data`)).json();
      for (const gpu of data.gpus) assertRequestHoldsAlone(gpu.holds);
      const text = await page.evaluate(() => document.body.innerText);
      for (const id of ids) assert.ok(text.includes(id), `request ${id} listed`);
      assert.match(text, /Workers/);
      assert.match(text, /Caches/);
      // The version and the clock's zone in the header (operators report both).
      assert.equal(data.version, KCORAL_VERSION);
      assert.ok(text.includes(`kcoral ${KCORAL_VERSION} · instance`), text.slice(0, 300));
      assert.match(text, /times UTC/);
      assert.doesNotMatch(text, /SECRET/);
      assert.doesNotMatch(JSON.stringify(data), /SECRET/);
      assert.deepEqual(errors, []);
      if (SCREENSHOTS) {
        await page.select("#window", "10000");
        await new Promise((resolve) => setTimeout(resolve, 300));
        await page.screenshot({ path: `${SCREENSHOTS}/status-server.png`, fullPage: true });
      }
    } finally {
      await browser.close();
      await server.stop();
    }
  },
});

Deno.test({
  name: "status page: a Router's page lists its two nodes",
  ignore: CHROMIUM === undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const router = await startRouter();
    const nodes = [await startNode(router.url, "cpu-a"), await startNode(router.url, "cpu-b")];
    const browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      args: ["--no-sandbox", "--headless=new"],
    });
    try {
      await waitForCapacity(router.url, 2);
      await using client = new Client(router.url);
      for (let i = 0; i < 4; i++) await client.execute(secretProgram());
      const { page, errors } = await open(browser, `${router.url}/status`);
      await page.waitForFunction(
        () => document.querySelectorAll("#nodes tr").length === 3, // a header and two nodes
      );
      const rows = await page.$$eval(
        "#nodes tr",
        (trs) => trs.slice(1).map((tr) => [...tr.querySelectorAll("td")].map((td) => td.innerText)),
      );
      assert.deepEqual(rows.map((r) => r[0]).sort(), ["cpu-a", "cpu-b"]);
      assert.ok(rows.every((r) => r[1] === "ready" && r[2] === "1"), JSON.stringify(rows));
      const text = await page.evaluate(() => document.body.innerText);
      assert.match(text, /KCoral Router/);
      assert.ok(text.includes(`kcoral ${KCORAL_VERSION} · instance`), text.slice(0, 300));
      assert.doesNotMatch(text, /SECRET/);
      assert.deepEqual(errors, []);
      if (SCREENSHOTS) {
        await page.screenshot({ path: `${SCREENSHOTS}/status-router.png`, fullPage: true });
      }
    } finally {
      await browser.close();
      for (const node of nodes) await node.stop();
      await router.stop();
    }
  },
});
