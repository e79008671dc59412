/**
 * What client tokens and TLS cost a trivial program on a reused worker: three servers (two
 * reused workers each, simulated GPUs) started in the same run (plain, with
 * `--client-token`, with `--client-token` and `--tls-cert`), asked in interleaved rounds so
 * that drift on a shared machine hits every row alike. `plain, fetch` separates the cost of
 * the `fetch` transport (which every `https://` client uses: a new connection, so a new TLS
 * handshake, for each POST) from TLS's own. Certificates are made with `openssl`. Median and
 * p10 of 8 rounds × 40 requests after 20 warm-up requests per row.
 *
 *   deno run -A bench/probes/token_tls_latency.ts
 *
 * @module
 */
import { Client, type ClientOptions } from "../../mod.ts";
import { startReusedServer } from "./_probe.ts";
import { trivialProgram } from "../_programs.ts";
import { makePki } from "../../tests/_pki.ts";

const TOKEN = "bench-Token_1";
const pki = await makePki();
const ca = await Deno.readTextFile(pki.ca);

// A token on a command line is fine for a throwaway bench server (docs/security.md).
const plain = await startReusedServer(2);
const token = await startReusedServer(2, { extra: ["--client-token", TOKEN] });
const tls = await startReusedServer(2, {
  extra: [
    "--client-token",
    TOKEN,
    "--tls-cert",
    pki.cert,
    "--tls-key",
    pki.key,
  ],
});

const rows: { name: string; url: string; options: ClientOptions }[] = [
  { name: "plain (own HTTP/1.1)", url: plain.url, options: {} },
  { name: "plain, fetch", url: plain.url, options: { transport: "fetch" } },
  { name: "token (own HTTP/1.1)", url: token.url, options: { token: TOKEN } },
  {
    name: "token + TLS (fetch)",
    url: tls.url.replace("http:", "https:"),
    options: { token: TOKEN, caCerts: [ca] },
  },
];
try {
  const program = trivialProgram();
  const clients = rows.map((row) => new Client(row.url, row.options));
  const samples = rows.map(() => [] as number[]);
  for (const client of clients) for (let i = 0; i < 20; i++) await client.execute(program);
  for (let round = 0; round < 8; round++) {
    for (let r = 0; r < rows.length; r++) {
      for (let i = 0; i < 40; i++) {
        const start = performance.now();
        await clients[r].execute(program);
        samples[r].push(performance.now() - start);
      }
    }
  }
  for (const client of clients) client.close();
  console.log("| trivial, reused worker | median ms | p10 ms |");
  console.log("|---|---:|---:|");
  for (let r = 0; r < rows.length; r++) {
    const ms = samples[r].sort((a, b) => a - b);
    console.log(
      `| ${rows[r].name} | ${ms[ms.length >> 1].toFixed(2)} | ${
        ms[Math.floor(ms.length * 0.1)].toFixed(2)
      } |`,
    );
  }
} finally {
  await Promise.all([plain.stop(), token.stop(), tls.stop()]);
  await Deno.remove(pki.dir, { recursive: true });
}
