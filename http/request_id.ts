/**
 * Request ids (spec server §8): a client's `X-Request-ID` is kept only when it is exactly one
 * canonical lowercase UUID (never arbitrary header content in file names and logs); otherwise a new
 * one is made.
 *
 * @module
 */

const _UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The request's id: the client's `X-Request-ID` when it is one canonical UUID, else a new one. */
export function requestId(headers: Headers): string {
  // Headers joins repeated values with ", ", so a single canonical UUID means one header.
  const value = headers.get("x-request-id");
  if (value !== null && _UUID.test(value)) return value;
  return crypto.randomUUID();
}
