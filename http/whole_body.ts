/**
 * A message's whole body kept beside it as bytes, so that the side that takes it need not pull it
 * through the body's stream (a stream, a reader and a collecting read per message): the HTTP/1.1
 * connection keeps a small request body that came with its head, and an application that answers
 * with bytes it holds whole keeps them beside its `Response`. The body's stream stays as it was
 * (a reader that uses it gets the same bytes); once it is used, the kept bytes are not given out.
 *
 * @module
 */

const _bodies = new WeakMap<Request | Response, Uint8Array>();

/**
 * `message`, with `bytes` kept as its whole body for {@linkcode wholeBody}; `bytes` must be what
 * its body holds, and must not change afterwards.
 *
 * @example
 * ```ts
 * import { wholeBody, withWholeBody } from "./whole_body.ts";
 *
 * const bytes = new TextEncoder().encode("ok");
 * const response = withWholeBody(new Response(bytes), bytes);
 * if (wholeBody(response) !== bytes) throw new Error("not kept");
 * ```
 */
export function withWholeBody<T extends Request | Response>(message: T, bytes: Uint8Array): T {
  _bodies.set(message, bytes);
  return message;
}

/**
 * The bytes kept as `message`'s whole body by {@linkcode withWholeBody}; `undefined` when none
 * were kept or its body's stream has been used.
 *
 * @example
 * ```ts
 * import { wholeBody } from "./whole_body.ts";
 *
 * if (wholeBody(new Response("made elsewhere")) !== undefined) throw new Error("kept?");
 * ```
 */
export function wholeBody(message: Request | Response): Uint8Array | undefined {
  return message.bodyUsed ? undefined : _bodies.get(message);
}
