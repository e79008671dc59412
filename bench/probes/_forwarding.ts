/**
 * The Router's forwarding code in one process, for `forward_in_process.ts` and
 * `forward_in_process_ab.ts`: a registry with one ready node and one slot that offers whole
 * frames, whose socket answers each request in a microtask with a whole frame of a small JSON
 * answer; the metrics listener on the event log as the Router has it. The modules come from
 * `tree` (a checkout), so two checkouts can run side by side.
 *
 * @module
 */

/** A ready forwarding loop of one checkout. */
export interface Forwarding {
  /** The trivial request every run sends (a one-byte body, seven headers). */
  newRequest(): Request;
  /** The answer's body and headers, as the stand-in node sends them. */
  answer: Uint8Array<ArrayBuffer>;
  answerHeaders: [string, string][];
  /** Forwards one request and reads its answer; throws unless it is a 200. */
  run(): Promise<void>;
  /** The checkout's event log (its `flush` writes the gathered lines). */
  events: { flush(): void; emit(level: string, event: string, fields: object): void };
  /** Stops the metrics listener, the registry and the event log. */
  close(): void;
}

/**
 * The loop for the checkout at `tree` (a path; default this one). `clientWatch`: give forwarding
 * a client watch and an `onFinished`, as the Router's app does.
 */
export async function forwarding(
  tree: string = new URL("../..", import.meta.url).pathname,
  options: { clientWatch?: boolean } = {},
): Promise<Forwarding> {
  const root = new URL(`${tree.replace(/\/$/, "")}/`, `file://${Deno.cwd()}/`);
  const load = (path: string) => import(new URL(path, root).href);
  const { forwardExecute } = await load("router/forward.ts");
  const { NodeRegistry } = await load("router/registry.ts");
  const { RouterSlot } = await load("router/slot_link.ts");
  const { RouterMetrics } = await load("router/metrics.ts");
  const { ClientWatch } = await load("router/client_watch.ts");
  const { EventLog } = await load("http/events.ts");
  const { decodeWholeFrame, encodeWholeFrame } = await load("protocol/node_link.ts");
  const { standInStatus } = await load("bench/_routed.ts");
  const events = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: () => {},
    consoleBatched: ["request_finished"],
  });
  const registry = new NodeRegistry({
    maxStatusAgeMs: 1e9,
    unhealthyThreshold: 3,
    recoveryThreshold: 1,
    nodeRetentionMs: 600_000,
    statusCheckIntervalMs: 1000,
    maxQueuedRequests: 16,
    queueWaitTimeoutMs: 1000,
  });
  const metrics = new RouterMetrics(events, registry);
  registry.controlStatus({ connectionId: "c", close() {} }, standInStatus("n", "i"), true);
  const answer = new TextEncoder().encode('{"status":"COMPLETED","outputs":{}}');
  const answerHeaders: [string, string][] = [
    ["content-type", "application/json"],
    ["content-length", String(answer.length)],
  ];
  const socket = {
    send(data: Uint8Array) {
      const { head } = decodeWholeFrame(data);
      const frame = encodeWholeFrame({
        t: "response_head",
        request_id: head.request_id,
        status: 200,
        headers: [...answerHeaders, ["x-request-id", head.request_id]],
      }, answer);
      queueMicrotask(() => slot.receive(frame.buffer));
    },
    close() {},
  };
  const hello = {
    t: "hello",
    node_id: "n",
    server_instance_id: "i",
    slot_id: "x",
    protocol_version: 1,
    whole: true,
  };
  const slot = new RouterSlot(socket, hello, () => {});
  registry.registerSlot(hello, slot);
  const ctx: Record<string, unknown> = { registry, maxRequestBytes: 1 << 28, events };
  if (options.clientWatch) Object.assign(ctx, { clientWatch: new ClientWatch(), onFinished() {} });
  const body = new Uint8Array([120]);
  const headers = {
    "content-type": "application/octet-stream",
    "content-length": "1",
    host: "127.0.0.1:9000",
    "user-agent": "kcoral-ts/0.1",
    accept: "*/*",
    "x-a": "1",
    "x-b": "2",
  };
  const newRequest = () =>
    new Request("http://127.0.0.1:9000/execute", { method: "POST", body, headers });
  return {
    newRequest,
    answer,
    answerHeaders,
    async run() {
      const response: Response = await forwardExecute(newRequest(), ctx);
      if (response.status !== 200) throw new Error(`${tree}: status ${response.status}`);
      await response.arrayBuffer();
    },
    events,
    close() {
      metrics.close();
      registry.close();
      events.close();
    },
  };
}
