/**
 * A failed TLS connection, said plainly: Deno reports certificate problems as rustls names them
 * (`invalid peer certificate: UnknownIssuer`), deep in an error's `cause` chain. The client and a
 * node's links to its Router (which share nothing else) turn them into one sentence that says what
 * is wrong and what to do. Text only, no I/O.
 *
 * @module
 */

/** Each known failure: how rustls (or the peer) words it, and what to tell the user. */
const _FAILURES: readonly [RegExp, (match: RegExpExecArray) => string][] = [
  [
    /invalid peer certificate: UnknownIssuer/,
    () =>
      "the server's TLS certificate is not signed by a trusted authority (UnknownIssuer): " +
      "trust the CA that signed it (caCerts, --ca-file or KCORAL_CA_FILE)",
  ],
  [
    /invalid peer certificate: Expired/,
    () => "the server's TLS certificate has expired (Expired): the server needs a new one",
  ],
  [
    /invalid peer certificate: NotValidYet/,
    () => "the server's TLS certificate is not valid yet (NotValidYet): check both clocks",
  ],
  [
    /invalid peer certificate: (certificate not valid for name [^\n]*)/,
    (m) => `the server's TLS certificate does not match the address asked: ${m[1]}`,
  ],
  [
    /CaUsedAsEndEntity/,
    () =>
      "the server's TLS certificate is a CA certificate (CA:TRUE, what `openssl req -x509` " +
      "makes by default) used as the server's own (CaUsedAsEndEntity): make it with " +
      "`-addext basicConstraints=critical,CA:FALSE`, or sign a server certificate with a CA " +
      "(docs/security.md)",
  ],
  [
    /invalid peer certificate: ([A-Za-z]+)/,
    (m) => `the server's TLS certificate was refused (${m[1]})`,
  ],
  [
    /corrupt message of type InvalidContentType|InvalidContentType/,
    () => "the server did not answer TLS: does it serve plain http:// rather than https://?",
  ],
];

/**
 * The plain description of a TLS failure anywhere in `error`'s `cause` chain, or `null` when it is
 * not one.
 */
export function describeTlsFailure(error: unknown): string | null {
  const seen = new Set<unknown>();
  for (let e = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    for (const [pattern, describe] of _FAILURES) {
      const match = pattern.exec(e.message);
      if (match) return describe(match);
    }
  }
  return null;
}
