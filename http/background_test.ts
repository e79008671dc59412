import { Background } from "./background.ts";

Deno.test("background: Background", async () => {
  const background = new Background();
  let done = false;
  background.track(
    new Promise<void>((resolve) =>
      setTimeout(() => {
        done = true;
        resolve();
      }, 5)
    ),
  );
  background.track(Promise.reject(new Error("ignored")));
  await background.settled();
  if (!done) throw new Error();
});
