/**
 * Client tokens (opt-in): the bearer tokens a server or Router accepts on `/execute`, `/metrics`
 * and `/status` (and `/health` when asked), from `--client-token`, `KCORAL_CLIENT_TOKEN` and
 * `--client-token-file` (reread by {@linkcode ClientTokens.reload}; a failed reload keeps the
 * previous set). A missing or wrong token is a 401 ERROR body with `WWW-Authenticate: Bearer
 * realm="kcoral"`; `?token=` in the URL is ignored. No token ever reaches a message, an event or a
 * log line.
 *
 * @module
 */
import { errorBody, errorMessage } from "../protocol/errors.ts";

/** Why a request was refused (the `reason` of a `client_unauthorized` event). */
export type RefusalReason = "missing" | "malformed" | "invalid";

/** The fixed messages of the 401 bodies, one per {@linkcode RefusalReason}. */
export const UNAUTHORIZED_MESSAGES: Readonly<Record<RefusalReason, string>> = Object.freeze({
  missing: "missing bearer token: send the header 'Authorization: Bearer <token>'",
  malformed: "malformed Authorization header: expected 'Bearer <token>'",
  invalid: "invalid bearer token",
});

/** RFC 6750's `b64token`: what a bearer token may contain (no spaces, no commas). */
const _TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/;

/**
 * Why `token` cannot be a client token (`null` when it can): RFC 6750's token characters only
 * (letters, digits, `-._~+/`, trailing `=`). The message never quotes the token.
 */
function _tokenProblem(token: string): string | null {
  if (token === "") return "must not be empty";
  if (!_TOKEN.test(token)) {
    return "must be letters, digits and '-._~+/' (optionally ending in '='), with no spaces or commas";
  }
  return null;
}

/**
 * Whether `given` equals `expected`, in time that depends only on `expected`'s length (never on
 * where they differ, nor on `given`'s length).
 */
export function tokensEqual(given: string, expected: string): boolean {
  const a = _encoder.encode(given);
  const b = _encoder.encode(expected);
  let diff = a.length ^ b.length;
  for (let i = 0; i < b.length; i++) diff |= b[i] ^ (a.length === 0 ? 0 : a[i % a.length]);
  return diff === 0 && a.length > 0;
}

const _encoder = new TextEncoder();

/**
 * The tokens of a token file: one per line, blank lines and `#` comments skipped, surrounding
 * whitespace trimmed. Throws an `Error` naming the file and the line (never the token) when it
 * cannot be read or a line is not a token.
 */
function _readTokenFile(path: string): string[] {
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch (error) {
    throw new Error(`cannot read the client token file ${path}: ${errorMessage(error)}`);
  }
  const tokens: string[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const hash = lines[i].indexOf("#");
    const token = (hash >= 0 ? lines[i].slice(0, hash) : lines[i]).trim();
    if (token === "") continue;
    const problem = _tokenProblem(token);
    if (problem !== null) {
      throw new Error(`client token file ${path}, line ${i + 1}: a token ${problem}`);
    }
    tokens.push(token);
  }
  return tokens;
}

/**
 * Splits command-line token values on commas (`--client-token a,b`, `KCORAL_CLIENT_TOKEN=a,b`) and
 * checks each; throws a `TypeError` naming `flag` (never the token) for an invalid one.
 */
export function splitTokens(values: readonly string[], flag: string): string[] {
  const tokens: string[] = [];
  for (const value of values) {
    for (const part of value.split(",")) {
      const token = part.trim();
      const problem = _tokenProblem(token);
      if (problem !== null) throw new TypeError(`${flag}: a token ${problem}`);
      tokens.push(token);
    }
  }
  return tokens;
}

/** Where a {@linkcode ClientTokens} set comes from. */
export interface ClientTokensOptions {
  /** Tokens given directly (already split and checked, e.g. with {@linkcode splitTokens}). */
  tokens?: readonly string[];
  /** A token file, read now and by every {@linkcode ClientTokens.reload}; `null`: none. */
  file?: string | null;
  /** `/health` needs a token as well (default `false`: it stays open). */
  protectHealth?: boolean;
}

/** What {@linkcode ClientTokens.reload} did. */
export type ReloadResult =
  | { readonly ok: true; readonly count: number }
  | { readonly ok: false; readonly error: string };

/**
 * The accepted client tokens and the check of a request's `Authorization` header.
 *
 * @example
 * ```ts
 * import { ClientTokens } from "./client_tokens.ts";
 *
 * const tokens = new ClientTokens({ tokens: ["s3cret"] });
 * const ok = new Request("http://x/execute", { headers: { authorization: "Bearer s3cret" } });
 * const bad = new Request("http://x/execute?token=s3cret");
 * if (tokens.check(ok) !== null || tokens.check(bad) !== "missing") throw new Error();
 * ```
 */
export class ClientTokens {
  /** `/health` needs a token as well. */
  readonly protectHealth: boolean;
  /** The token file, or `null`. */
  readonly file: string | null;
  readonly #given: readonly string[];
  #accepted: readonly string[];

  /**
   * Reads the file, if any (throws its `Error` when it cannot be read); an empty set in all is a
   * `TypeError` (nothing could ever be accepted).
   */
  constructor(options: ClientTokensOptions) {
    this.#given = [...(options.tokens ?? [])];
    this.file = options.file ?? null;
    this.protectHealth = options.protectHealth ?? false;
    for (const token of this.#given) {
      const problem = _tokenProblem(token);
      if (problem !== null) throw new TypeError(`a client token ${problem}`);
    }
    this.#accepted = this.#collect();
  }

  /** How many distinct tokens are accepted now. */
  get count(): number {
    return this.#accepted.length;
  }

  /**
   * Reads the token file again (tokens given directly stay). On failure the previous set stays in
   * force and the result says why (the file and line, never a token).
   */
  reload(): ReloadResult {
    try {
      this.#accepted = this.#collect();
      return { ok: true, count: this.#accepted.length };
    } catch (error) {
      return { ok: false, error: errorMessage(error) };
    }
  }

  /**
   * Checks `request`'s `Authorization` header: `null` when it carries an accepted bearer token,
   * otherwise why not. Every accepted token is compared, in constant time each, whatever matches.
   * The URL is never looked at (a `?token=` is no token).
   */
  check(request: Request): RefusalReason | null {
    const header = request.headers.get("authorization");
    if (header === null || header.trim() === "") return "missing";
    const match = /^Bearer +(\S+) *$/i.exec(header);
    if (!match) return "malformed";
    let found = 0;
    for (const token of this.#accepted) found |= tokensEqual(match[1], token) ? 1 : 0;
    return found === 1 ? null : "invalid";
  }

  #collect(): string[] {
    const tokens = new Set(this.#given);
    if (this.file !== null) { for (const token of _readTokenFile(this.file)) tokens.add(token); }
    if (tokens.size === 0) {
      throw new TypeError(
        this.file === null
          ? "no client token given"
          : `the client token file ${this.file} holds no token`,
      );
    }
    return [...tokens];
  }
}

/**
 * The 401 answer for `reason`: an ERROR body of kind `unauthorized` (spec protocol §3.5's shape),
 * `WWW-Authenticate: Bearer realm="kcoral"` (with `error="invalid_token"` for a wrong token, as RFC
 * 6750 §3.1) and `X-Request-ID`.
 */
export function unauthorizedResponse(reason: RefusalReason, requestId: string): Response {
  const challenge = reason === "missing"
    ? 'Bearer realm="kcoral"'
    : `Bearer realm="kcoral", error="${
      reason === "invalid" ? "invalid_token" : "invalid_request"
    }"`;
  return new Response(errorBody(requestId, "unauthorized", UNAUTHORIZED_MESSAGES[reason]), {
    status: 401,
    headers: {
      "content-type": "application/json",
      "x-request-id": requestId,
      "www-authenticate": challenge,
    },
  });
}
