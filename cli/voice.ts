/**
 * One voice for what the client commands (`kcoral run`, `health`, `mcp`, `eval`) say when
 * something fails: the failure on one line as the command already words it
 * (`kcoral run python: TransportError: cannot connect to …`), then, when there is something to
 * do about it, one `hint:` line that says what. A malformed server URL is a usage error (exit 2)
 * with a suggestion, checked by {@linkcode checkServerUrl} before anything is contacted.
 *
 * ```
 *  --url / KCORAL_URL ─▶ checkServerUrl ─▶ error (exit 2): "argument --url: …; did you mean …?"
 *  a failed request   ─▶ failureHint(error, url) ─▶ "hint: is a KCoral server running at …?"
 * ```
 *
 * New client commands print failures with {@linkcode failureLines}.
 *
 * @module
 */

/**
 * Why `url` cannot name a KCoral server, or `null` when it can: it must parse as an `http://` or
 * `https://` URL with a host. `source` names where it came from (`--url`, `KCORAL_URL`).
 *
 * @example
 * ```ts
 * import { checkServerUrl } from "./voice.ts";
 *
 * if (checkServerUrl("http://gpu-box:8000", "--url") !== null) throw new Error();
 * const message = checkServerUrl("localhost:8000", "--url");
 * if (message !== "argument --url: not an http:// or https:// URL: 'localhost:8000' " +
 *   "(did you mean http://localhost:8000?)") throw new Error(String(message));
 * if (!checkServerUrl("notaurl", "KCORAL_URL")?.includes("did you mean http://notaurl?")) {
 *   throw new Error();
 * }
 * ```
 */
export function checkServerUrl(url: string, source: string): string | null {
  let parsed: URL | null = null;
  try {
    parsed = new URL(url);
  } catch {
    // not a URL at all
  }
  if (parsed && (parsed.protocol === "http:" || parsed.protocol === "https:") && parsed.host) {
    return null;
  }
  const bare = url.trim();
  const looksLikeHost = /^[A-Za-z0-9.[\]:-]+(\/.*)?$/.test(bare) && !bare.includes("://");
  const suggestion = looksLikeHost ? ` (did you mean http://${bare}?)` : "";
  return `argument ${source}: not an http:// or https:// URL: '${url}'${suggestion}`;
}

/**
 * What to do about a failed request to `url`, or `null` when the message says it all already.
 *
 * @example
 * ```ts
 * import { failureHint } from "./voice.ts";
 *
 * const refused = new Error("cannot connect to 127.0.0.1:8000: Connection refused (os error 111)");
 * if (!failureHint(refused, "http://127.0.0.1:8000")?.includes("kcoral server")) {
 *   throw new Error();
 * }
 * if (failureHint(new Error("bad kernel"), "http://127.0.0.1:8000") !== null) throw new Error();
 * const deadline = new Error("HTTP 504: execution timed out");
 * if (failureHint(deadline, "http://127.0.0.1:8000") !== null) throw new Error();
 * ```
 */
export function failureHint(error: unknown, url: string): string | null {
  const text = _messages(error);
  if (/Connection refused|ECONNREFUSED/i.test(text)) {
    return `is a KCoral server running at ${url}? Check the address and the port ` +
      "(`kcoral server` starts one here)";
  }
  if (
    /failed to lookup address|Name or service not known|dns error|No address associated/i.test(text)
  ) {
    return `the host of ${url} does not resolve: check the name, or use its IP address`;
  }
  if (/HTTP 401\b|refused the request \(HTTP 401/.test(text)) {
    return "the server wants a client token: pass --token or set KCORAL_TOKEN";
  }
  if (/HTTP 403\b/.test(text)) {
    return "the server refused this client token: ask its operator for a valid one";
  }
  // A connection that never opened; a program's own deadline (504 `execution timed out`) is not.
  if (
    /timed out connecting|cannot connect[^\n]*(timed out|TimedOut)|no answer within/i.test(text)
  ) {
    return `nothing answered at ${url} in time: is the address right, and the port open?`;
  }
  return null;
}

/**
 * The lines a command prints for a failure: `PROGRAM: MESSAGE`, then `hint: …` when
 * {@linkcode failureHint} has one (each line ends with a newline).
 *
 * @example
 * ```ts
 * import { failureLines } from "./voice.ts";
 *
 * const text = failureLines(
 *   "kcoral health",
 *   "cannot reach http://127.0.0.1:1/health: Connection refused (os error 111)",
 *   new Error("Connection refused"),
 *   "http://127.0.0.1:1",
 * );
 * if (!text.startsWith("kcoral health: cannot reach") || !/\nhint: is a KCoral/.test(text)) {
 *   throw new Error(text);
 * }
 * ```
 */
export function failureLines(
  program: string,
  message: string,
  error: unknown,
  url: string,
): string {
  const hint = failureHint(error, url) ?? failureHint(new Error(message), url);
  return `${program}: ${message}\n${hint ? `hint: ${hint}\n` : ""}`;
}

/** Every message of `error`'s cause chain, one per line. */
function _messages(error: unknown): string {
  const seen = new Set<unknown>();
  const parts: string[] = [];
  for (let e = error; e !== undefined && e !== null && !seen.has(e);) {
    seen.add(e);
    parts.push(e instanceof Error ? e.message : String(e));
    e = e instanceof Error ? e.cause : undefined;
  }
  return parts.join("\n");
}
