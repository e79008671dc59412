/**
 * Certificates for TLS tests and benchmarks, made with `openssl` in a new temporary directory:
 * a CA, a second CA that signed nothing, a server certificate for 127.0.0.1 and localhost signed
 * by the first, and the same certificate already expired.
 */

/** The files {@linkcode makePki} made. */
export interface Pki {
  dir: string;
  ca: string;
  otherCa: string;
  cert: string;
  key: string;
  expired: string;
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", {
    args,
    cwd: dir,
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  if (!out.success) throw new Error(`openssl ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
}

/** Makes the certificates (EC P-256, valid two days; the expired one ended yesterday). */
export async function makePki(): Promise<Pki> {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-tls-" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  for (const name of ["ca", "other-ca"]) {
    await openssl(
      dir,
      "req",
      "-x509",
      ...ec,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.pem`,
      "-days",
      "2",
      "-subj",
      `/CN=KCoral test ${name}`,
    );
  }
  await openssl(
    dir,
    "req",
    ...ec,
    "-keyout",
    "server.key",
    "-out",
    "server.csr",
    "-subj",
    "/CN=localhost",
  );
  await Deno.writeTextFile(`${dir}/ext`, "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  const sign = (out: string, days: string) =>
    openssl(
      dir,
      "x509",
      "-req",
      "-in",
      "server.csr",
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      out,
      "-days",
      days,
      "-extfile",
      "ext",
    );
  await sign("server.pem", "2");
  // Negative days: its notAfter is a day before now (OpenSSL 3.0 has no -not_after).
  await sign("expired.pem", "-1");
  return {
    dir,
    ca: `${dir}/ca.pem`,
    otherCa: `${dir}/other-ca.pem`,
    cert: `${dir}/server.pem`,
    key: `${dir}/server.key`,
    expired: `${dir}/expired.pem`,
  };
}
