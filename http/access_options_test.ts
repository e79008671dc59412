import {
  accessOptions,
  checkAccessConfig,
  loadAccess,
  openBindWarning,
  readCaFile,
} from "./access_options.ts";

Deno.test("access_options: accessOptions", () => {
  if (accessOptions.clientTokens.env !== "KCORAL_CLIENT_TOKEN") throw new Error();
});

Deno.test("access_options: checkAccessConfig", () => {
  try {
    checkAccessConfig({ tlsCert: "cert.pem" });
    throw new Error("accepted");
  } catch (error) {
    if ((error as Error).message !== "--tls-cert requires --tls-key") throw error;
  }
});

Deno.test("access_options: loadAccess", () => {
  const access = loadAccess({
    clientTokens: ["s3cret"],
    clientTokenFile: null,
    protectHealth: false,
    tlsCert: null,
    tlsKey: null,
  });
  if (access.tokens?.count !== 1 || access.tls !== null) throw new Error();
});

Deno.test("access_options: readCaFile", () => {
  try {
    readCaFile("/nonexistent/ca.pem");
    throw new Error("read");
  } catch (error) {
    if (!(error as Error).message.startsWith("cannot read the CA file /nonexistent/ca.pem")) {
      throw error;
    }
  }
});

Deno.test("access_options: openBindWarning", () => {
  if (!openBindWarning("0.0.0.0", null, "kcoral server")?.includes("without client tokens")) {
    throw new Error();
  }
  if (openBindWarning("127.0.0.1", null, "kcoral server") !== null) throw new Error();
  if (openBindWarning("::1", null, "kcoral router") !== null) throw new Error();
});
