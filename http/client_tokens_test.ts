import { ClientTokens } from "./client_tokens.ts";
import { splitTokens, tokensEqual, unauthorizedResponse } from "./client_tokens.ts";

Deno.test("client_tokens: tokensEqual", () => {
  if (!tokensEqual("s3cret", "s3cret") || tokensEqual("s3crex", "s3cret")) throw new Error();
  if (tokensEqual("", "s3cret") || tokensEqual("s3cret-and-more", "s3cret")) throw new Error();
});

Deno.test("client_tokens: splitTokens", () => {
  if (splitTokens(["a,b", "c"], "--client-token").join(" ") !== "a b c") throw new Error();
});

Deno.test("client_tokens: unauthorizedResponse", () => {
  const response = unauthorizedResponse("missing", "0f6c2b4e-1111-4222-8333-444455556666");
  if (response.status !== 401 || !response.headers.get("www-authenticate")) throw new Error();
});

Deno.test("client_tokens: ClientTokens.reload", async () => {
  const file = await Deno.makeTempFile();
  await Deno.writeTextFile(file, "first\n");
  const tokens = new ClientTokens({ file });
  await Deno.writeTextFile(file, "second\n");
  const reloaded = tokens.reload();
  if (!reloaded.ok || reloaded.count !== 1) throw new Error();
  const first = new Request("http://x/", { headers: { authorization: "Bearer first" } });
  if (tokens.check(first) !== "invalid") throw new Error();
  await Deno.remove(file);
});
