import {
  encodeChunkLine,
  encodeFinalLine,
  isLiveOutput,
  LiveOutputReader,
  wantsLiveOutput,
} from "./live_output.ts";

Deno.test("live_output: wantsLiveOutput", () => {
  if (!wantsLiveOutput(new Headers({ "X-KCoral-Stream": "output" }))) throw new Error();
  if (wantsLiveOutput(new Headers())) throw new Error();
});

Deno.test("live_output: isLiveOutput", () => {
  if (!isLiveOutput("application/vnd.kcoral.live-output")) throw new Error();
  if (isLiveOutput("application/json")) throw new Error();
});

Deno.test("live_output: encodeChunkLine", () => {
  const line = new TextDecoder().decode(encodeChunkLine({ stream: "stdout", data: "hi\n" }));
  if (line !== '{"stream":"stdout","data":"hi\\n"}\n') throw new Error(line);
});

Deno.test("live_output: encodeFinalLine", () => {
  const line = new TextDecoder().decode(
    encodeFinalLine(200, new Headers({ "content-type": "application/json" }), 2),
  );
  if (
    line !== '{"final":{"status":200,"headers":[["content-type","application/json"]],"length":2}}\n'
  ) {
    throw new Error(line);
  }
});

Deno.test("live_output: LiveOutputReader", () => {
  const seen: string[] = [];
  const reader = new LiveOutputReader((chunk) => seen.push(chunk.data));
  reader.push(encodeChunkLine({ stream: "stdout", data: "a" }));
  reader.push(encodeFinalLine(200, new Headers({ "content-type": "application/json" }), 2));
  reader.push(new TextEncoder().encode("{}"));
  const final = reader.finish();
  if (seen.join() !== "a" || new TextDecoder().decode(final.body) !== "{}") throw new Error();
});
