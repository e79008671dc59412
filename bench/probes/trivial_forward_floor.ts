/**
 * The floor under a Router's trivial request, without any Router code: one client (keep-alive
 * `fetch`, one request at a time, a one-byte body) through a forwarder to a stand-in node that
 * answers every request at once over a WebSocket in one frame, the three in separate
 * processes on loopback. Two forwarders take turns, rounds of `--requests` each:
 *
 * - `floor`: `Deno.serve` takes the node's WebSocket (`Deno.upgradeWebSocket`); each request's
 *   body is read, sent as one message with a request id, and the node's message for that id is
 *   answered with its bytes and a content type — the least any forwarder over one WebSocket does;
 * - `router`: a real `kcoral router`, the node linked as a real node is (control link, one slot;
 *   a request and its answer one frame each).
 *
 * Prints per way and round the client's p50 latency and the forwarder's CPU per request (from
 * /proc), then the medians.
 *
 *   deno run -A bench/probes/trivial_forward_floor.ts [--rounds N] [--requests N] [--answer-after MS]
 *
 * `--answer-after MS`: the stand-in nodes answer that long after a request's end, as a node whose
 * worker runs the program (a forwarder idles meanwhile, as it does in front of a real node).
 *
 * @module
 */
import { WebSocketClient } from "../../link/websocket_client.ts";
import { encodeMessage, PROTOCOL_VERSION, SLOT_PATH } from "../../link/messages.ts";
import { decodeRequestFrame, encodeFrame } from "../../link/frames.ts";
import { ownCpuMs } from "../_proc.ts";
import {
  freePort,
  spawnUntilReady,
  standInControl,
  startRouterProcess,
  waitForCapacity,
} from "../_routed.ts";
import { median, numberArg, positionalArgs, timeOneBytePosts } from "./_probe.ts";

const _ANSWER = new TextEncoder().encode('{"status":"COMPLETED"}');
const _SELF = new URL(import.meta.url).pathname;

/** How long the stand-in nodes wait before they answer (`--answer-after`), in ms. */
const _ANSWER_AFTER_MS = Number(Deno.env.get("KCORAL_PROBE_ANSWER_AFTER_MS") ?? "0");
const _answer = (send: () => void) =>
  _ANSWER_AFTER_MS > 0 ? setTimeout(send, _ANSWER_AFTER_MS) : send();

if (Deno.args[0] === "--forwarder") await _forwarder(Number(Deno.args[1]));
else if (Deno.args[0] === "--floor-node") await _floorNode(Number(Deno.args[1]));
else if (Deno.args[0] === "--router-node") await _routerNode(Number(Deno.args[1]));
else await _main();

/** The bare forwarder: requests go to the one node WebSocket, answers come back by id. */
function _forwarder(port: number): Promise<never> {
  let node: WebSocket | null = null;
  const waiting = new Map<string, (bytes: Uint8Array) => void>();
  Deno.serve(
    { hostname: "127.0.0.1", port, onListen: () => console.error("ready") },
    async (request) => {
      if (request.headers.get("upgrade") === "websocket") {
        const { socket, response } = Deno.upgradeWebSocket(request);
        socket.binaryType = "arraybuffer";
        socket.onmessage = (event) => {
          const bytes = new Uint8Array(event.data as ArrayBuffer);
          const id = String.fromCharCode(...bytes.subarray(0, 36));
          waiting.get(id)?.(bytes.subarray(36));
          waiting.delete(id);
        };
        node = socket;
        return response;
      }
      const body = await request.bytes();
      const id = crypto.randomUUID();
      const message = new Uint8Array(36 + body.length);
      for (let i = 0; i < 36; i++) message[i] = id.charCodeAt(i);
      message.set(body, 36);
      const answer = await new Promise<Uint8Array>((resolve) => {
        waiting.set(id, resolve);
        node!.send(message);
      });
      return new Response(answer as Uint8Array<ArrayBuffer>, {
        headers: { "content-type": "application/json", "x-request-id": id },
      });
    },
  );
  return new Promise<never>(() => {});
}

/** The floor's node: every message answered at once with the same id and the answer. */
function _floorNode(port: number): Promise<never> {
  const socket = new WebSocketClient(`ws://127.0.0.1:${port}/node`);
  socket.onopen = () => console.error("ready");
  socket.onmessage = (event) => {
    const bytes = new Uint8Array(event.data as ArrayBuffer);
    const out = new Uint8Array(36 + _ANSWER.length);
    out.set(bytes.subarray(0, 36));
    out.set(_ANSWER, 36);
    _answer(() => socket.send(out));
  };
  return new Promise<never>(() => {});
}

/** A node as the Router sees one: a control link and one slot. */
async function _routerNode(port: number): Promise<never> {
  const ws = `ws://127.0.0.1:${port}`;
  const instance = crypto.randomUUID();
  await standInControl(`http://127.0.0.1:${port}`, "stand-in", instance);
  const slot = new WebSocketClient(ws + SLOT_PATH);
  await new Promise<void>((resolve) => (slot.onopen = resolve));
  slot.send(encodeMessage({
    t: "hello",
    node_id: "stand-in",
    server_instance_id: instance,
    slot_id: crypto.randomUUID(),
    protocol_version: PROTOCOL_VERSION,
  }));
  const headers: [string, string][] = [
    ["content-type", "application/json"],
    ["content-length", String(_ANSWER.length)],
  ];
  slot.onmessage = (event) => {
    if (typeof event.data === "string") return;
    const frame = decodeRequestFrame(new Uint8Array(event.data));
    if (!frame.end) return;
    const answer = encodeFrame(frame.requestId, { status: 200, headers }, _ANSWER, true);
    _answer(() => slot.send(answer));
  };
  console.error("ready");
  return await new Promise<never>(() => {});
}

/** This script in another role, once it says it is ready. */
function _spawn(args: string[]): Promise<Deno.ChildProcess> {
  return spawnUntilReady([_SELF, ...args], "ready");
}

async function _main(): Promise<void> {
  // The stand-in nodes are processes of this module: they read the delay from the environment.
  Deno.env.set("KCORAL_PROBE_ANSWER_AFTER_MS", String(numberArg("--answer-after", 0)));
  const rounds = numberArg("--rounds", 5);
  const requests = numberArg("--requests", 1000);
  const port = freePort();
  const forwarder = await _spawn(["--forwarder", String(port)]);
  const floorNode = await _spawn(["--floor-node", String(port)]);
  const trees = positionalArgs();
  const routers = [];
  for (const tree of trees.length ? trees : [undefined]) {
    const router = await startRouterProcess([], tree);
    const node = await _spawn(["--router-node", new URL(router.url).port]);
    await waitForCapacity(router.url, 1);
    routers.push({ name: `router${tree ? ` ${tree}` : ""}`, router, node });
  }
  const only = Deno.args.includes("--only") ? Deno.args[Deno.args.indexOf("--only") + 1] : null;
  const ways = [
    { name: "floor", url: `http://127.0.0.1:${port}`, pid: forwarder.pid },
    ...routers.map(({ name, router }) => ({ name, url: router.url, pid: router.pid })),
  ].filter((way) => !only || way.name.startsWith(only));
  console.error(`pids: ${ways.map((way) => `${way.name} ${way.pid}`).join(", ")}`);
  const results = new Map(
    ways.map((way) => [way.name, { p50: [] as number[], cpu: [] as number[] }]),
  );
  for (const way of ways) await timeOneBytePosts(way.url, 500);
  for (let round = 0; round < rounds; round++) {
    for (const way of [...ways.slice(round % ways.length), ...ways.slice(0, round % ways.length)]) {
      const before = ownCpuMs(way.pid);
      const times = await timeOneBytePosts(way.url, requests);
      const cpu = (ownCpuMs(way.pid) - before) / requests;
      const p50 = median(times);
      results.get(way.name)!.p50.push(p50);
      results.get(way.name)!.cpu.push(cpu);
      console.log(
        `round ${round + 1} ${way.name}: p50 ${p50.toFixed(3)} ms, CPU ${
          cpu.toFixed(3)
        } ms/request`,
      );
    }
  }
  for (const [name, { p50, cpu }] of results) {
    console.log(
      `${name}: median p50 ${median(p50).toFixed(3)} ms, CPU ${median(cpu).toFixed(3)} ms/request`,
    );
  }
  for (const process of [forwarder, floorNode]) process.kill("SIGKILL");
  for (const { router, node } of routers) (node.kill("SIGKILL"), await router.stop());
}
