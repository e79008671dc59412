import {
  bearer,
  bearerMatches,
  EMPTY_NODE_TOKEN_VARIABLE,
  encodeMessage,
  isValidNodeId,
  LinkMessageError,
  parseControlMessage,
  parseRequestHead,
  parseResponseHead,
  parseSlotMessage,
} from "./messages.ts";

Deno.test("messages: LinkMessageError", () => {
  if (new LinkMessageError("bad").name !== "LinkMessageError") throw new Error();
});

Deno.test("messages: isValidNodeId", () => {
  if (!isValidNodeId("gpu-a.1") || isValidNodeId("bad name") || isValidNodeId("")) {
    throw new Error();
  }
});

Deno.test("messages: bearer", () => {
  if (bearer("s3cret") !== "Bearer s3cret") throw new Error();
});

Deno.test("messages: bearerMatches", () => {
  if (!bearerMatches("Bearer s3cret", "s3cret") || bearerMatches("Bearer s3crex", "s3cret")) {
    throw new Error();
  }
  if (bearerMatches(null, "s3cret") || !bearerMatches(null, null)) throw new Error();
});

Deno.test("messages: EMPTY_NODE_TOKEN_VARIABLE", () => {
  if (!EMPTY_NODE_TOKEN_VARIABLE.startsWith("KCORAL_NODE_TOKEN")) throw new Error();
});

Deno.test("messages: encodeMessage", () => {
  if (encodeMessage({ t: "ack" }) !== '{"t":"ack"}') throw new Error();
});

Deno.test("messages: parseControlMessage", () => {
  const status = parseControlMessage(JSON.stringify({
    t: "status",
    node_id: "gpu-a",
    server_healthy: false,
    supervisor_instance_id: "s1",
    server_instance_id: "",
    worker_count: 0,
    busy_workers: 0,
    target: {},
    versions: {},
    last_error: "KCoral Server is starting",
    health_age_millis: null,
  }));
  if (status.t !== "status" || status.node_id !== "gpu-a") throw new Error();
});

Deno.test("messages: parseRequestHead", () => {
  const head = parseRequestHead('{"headers":[["content-length","2"]],"content_length":2}');
  if (head.content_length !== 2 || head.headers[0][0] !== "content-length") throw new Error();
});

Deno.test("messages: parseResponseHead", () => {
  const head = parseResponseHead('{"status":200,"headers":[["content-type","text/plain"]]}');
  if (head.status !== 200) throw new Error();
});

Deno.test("messages: parseSlotMessage", () => {
  const m = parseSlotMessage(
    '{"t":"credit","request_id":"0f6c2b4e-1111-4222-8333-444455556666","frames":4}',
  );
  if (m.t !== "credit" || m.frames !== 4) throw new Error();
});
