/**
 * router/client_watch.ts: a request's client is watched only once the request has waited, and
 * `onGone` runs once, only while watched.
 */
import assert from "node:assert/strict";
import { ClientWatch } from "../router/client_watch.ts";

function request() {
  const controller = new AbortController();
  return {
    controller,
    request: new Request("http://router/execute", { method: "POST", signal: controller.signal }),
  };
}

Deno.test("client watch: a request answered before the delay never has its signal read", () => {
  let clock = 0;
  const watch = new ClientWatch(250, () => clock);
  const { request: r } = request();
  let read = 0;
  const spy = new Proxy(r, {
    get: (target, key) => (key === "signal" && read++, Reflect.get(target, key)),
  });
  const unwatch = watch.watch(spy, () => assert.fail("gone"));
  clock = 200;
  watch.check();
  assert.equal(read, 0);
  assert.equal(watch.waiting, 1);
  unwatch();
  assert.equal(watch.waiting, 0);
  clock = 1000;
  watch.check();
  assert.equal(read, 0);
});

Deno.test("client watch: a client gone after the delay is noticed once; oldest first", () => {
  let clock = 0;
  const watch = new ClientWatch(250, () => clock);
  const first = request();
  const gone: string[] = [];
  watch.watch(first.request, () => gone.push("first"));
  clock = 100;
  const second = request();
  watch.watch(second.request, () => gone.push("second"));
  clock = 260;
  watch.check(); // the first is due, the second not yet
  assert.equal(watch.waiting, 1);
  first.controller.abort();
  second.controller.abort(); // not watched yet: noticed at the next check
  assert.deepEqual(gone, ["first"]);
  clock = 400;
  watch.check();
  assert.deepEqual(gone, ["first", "second"]);
  first.controller.abort();
  assert.deepEqual(gone, ["first", "second"]);
});

Deno.test("client watch: unwatched after the delay, a client that goes is not reported", () => {
  let clock = 0;
  const watch = new ClientWatch(250, () => clock);
  const { request: r, controller } = request();
  const unwatch = watch.watch(r, () => assert.fail("reported after unwatch"));
  clock = 300;
  watch.check();
  unwatch();
  controller.abort();
});

Deno.test("client watch: the timer checks by itself", async () => {
  const watch = new ClientWatch(20);
  watch.start();
  try {
    const { request: r, controller } = request();
    const gone = new Promise<void>((resolve) => watch.watch(r, resolve));
    await new Promise((resolve) => setTimeout(resolve, 60));
    controller.abort();
    await gone;
    assert.equal(watch.waiting, 0);
  } finally {
    watch.stop();
  }
});
