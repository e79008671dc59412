/**
 * Credentials in a base URL (`http://user:secret@host/`): Basic authentication, as httpx and
 * `fetch` take them, sent by every transport.
 *
 * @module
 */

/**
 * The `Authorization` header value for the credentials in `url`, or `undefined` when it has
 * none. Percent-escapes are decoded; the `user:password` text is sent as UTF-8.
 *
 * @example
 * ```ts
 * import { basicAuthorization } from "./basic_auth.ts";
 *
 * if (basicAuthorization(new URL("http://user:pw@host/")) !== "Basic dXNlcjpwdw==") throw new Error();
 * if (basicAuthorization(new URL("http://host/")) !== undefined) throw new Error();
 * ```
 */
export function basicAuthorization(url: URL): string | undefined {
  if (!url.username && !url.password) return undefined;
  const user = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`;
  const bytes = new TextEncoder().encode(user);
  return `Basic ${btoa(String.fromCharCode(...bytes))}`;
}
