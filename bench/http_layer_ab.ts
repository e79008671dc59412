/**
 * The HTTP layer alone, `Deno.serve` against http/http1_server.ts, in one process and in
 * alternating rounds (docs/decisions/own-http1-connections.md): what the server's rows of a
 * trivial request, a 64 MiB request and a 64 MiB answer pay for the connection handling,
 * without workers or the pipeline to add noise.
 *
 * - trivial: a 600-byte POST on a keep-alive connection, its body read, a 200-byte JSON answer
 *   (request written → answer read whole)
 * - 64 MiB request: the body read with a BYOB reader into one reused buffer, as the server's
 *   intake does (request written → answer's first bytes)
 * - 64 MiB answer: a stream of 1 MiB chunks with its Content-Length, as a result body streams
 *   from its files (request written → last byte read)
 *
 *   deno run -A bench/http_layer_ab.ts [--rounds 6]
 *
 * @module
 */
import { serveHttp1 } from "../http/http1_server.ts";
import { byobRead } from "./_floors.ts";
import { type BenchRow, row, summarize, table } from "./_stats.ts";

const _MIB = 1 << 20;
const _SIZE = 64 * _MIB;
const _encoder = new TextEncoder();

type Handler = (request: Request) => Promise<Response>;

interface _Listening {
  port: number;
  stop(): Promise<void>;
}

function _denoServe(handler: Handler): _Listening {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, handler);
  return { port: server.addr.port, stop: () => server.shutdown() };
}

function _own(handler: Handler): _Listening {
  const server = serveHttp1({ hostname: "127.0.0.1", port: 0, handler });
  return { port: server.addr.port, stop: () => server.shutdown() };
}

function _handler(): Handler {
  const read = byobRead();
  const answer = JSON.stringify({ status: "COMPLETED", results: { out: 1 }, pad: "x".repeat(140) });
  const source = new Uint8Array(_MIB).fill(7);
  return async (request) => {
    const path = new URL(request.url).pathname;
    if (path === "/trivial") {
      await request.bytes();
      return new Response(answer, {
        headers: { "content-type": "application/json", "content-length": String(answer.length) },
      });
    }
    if (path === "/upload") {
      await read(request, _SIZE);
      return new Response("ok");
    }
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent === _SIZE) return controller.close();
        controller.enqueue(source.slice()); // a new chunk each time, as a file read gives
        sent += _MIB;
      },
    }, { highWaterMark: 0 });
    return new Response(body, { headers: { "content-length": String(_SIZE) } });
  };
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let offset = 0; offset < bytes.length;) offset += await conn.write(bytes.subarray(offset));
}

/** Reads one answer with a Content-Length off `conn` into `buffer`; its body length. */
async function _readAnswer(conn: Deno.Conn, buffer: Uint8Array): Promise<number> {
  let filled = 0;
  for (;;) {
    const n = await conn.read(buffer.subarray(filled));
    if (n === null) throw new Error("connection closed");
    filled += n;
    const text = new TextDecoder("latin1").decode(buffer.subarray(0, Math.min(filled, 4096)));
    const end = text.indexOf("\r\n\r\n");
    if (end === -1) continue;
    const length = Number(/content-length: (\d+)/i.exec(text)![1]);
    while (filled < end + 4 + length) {
      const more = await conn.read(buffer.subarray(filled));
      if (more === null) throw new Error("connection closed");
      filled += more;
    }
    return length;
  }
}

async function _round(listening: _Listening, quick: boolean) {
  const port = listening.port;
  const trivial: number[] = [];
  {
    using conn = await Deno.connect({ hostname: "127.0.0.1", port });
    const body = "b".repeat(600);
    const request = _encoder.encode(
      `POST /trivial HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n` +
        `content-length: ${body.length}\r\n\r\n${body}`,
    );
    const buffer = new Uint8Array(64 * 1024);
    for (let i = 0; i < (quick ? 100 : 400); i++) {
      const start = performance.now();
      await _writeAll(conn, request);
      await _readAnswer(conn, buffer);
      if (i >= 20) trivial.push(performance.now() - start);
    }
  }
  const upload: number[] = [];
  const download: number[] = [];
  const data = new Uint8Array(_SIZE).fill(3);
  const target = new Uint8Array(_SIZE + 4096);
  for (let i = 0; i < (quick ? 2 : 5); i++) {
    {
      using conn = await Deno.connect({ hostname: "127.0.0.1", port });
      const start = performance.now();
      await _writeAll(
        conn,
        _encoder.encode(`POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: ${_SIZE}\r\n\r\n`),
      );
      await _writeAll(conn, data);
      await _readAnswer(conn, target);
      upload.push(performance.now() - start);
    }
    {
      using conn = await Deno.connect({ hostname: "127.0.0.1", port });
      const start = performance.now();
      await _writeAll(conn, _encoder.encode(`GET /download HTTP/1.1\r\nhost: x\r\n\r\n`));
      const length = await _readAnswer(conn, target);
      if (length !== _SIZE) throw new Error(`answer of ${length} bytes`);
      download.push(performance.now() - start);
    }
  }
  return { trivial, upload, download };
}

if (import.meta.main) {
  const i = Deno.args.indexOf("--rounds");
  const rounds = i >= 0 ? Number(Deno.args[i + 1]) : 6;
  const quick = Deno.args.includes("--quick");
  const layers = { "Deno.serve": _denoServe, "http1_server.ts": _own } as const;
  type Layer = keyof typeof layers;
  const samples: Record<Layer, { trivial: number[]; upload: number[]; download: number[] }> = {
    "Deno.serve": { trivial: [], upload: [], download: [] },
    "http1_server.ts": { trivial: [], upload: [], download: [] },
  };
  for (let round = 0; round < rounds; round++) {
    const order: Layer[] = round % 2 === 0
      ? ["Deno.serve", "http1_server.ts"]
      : ["http1_server.ts", "Deno.serve"];
    for (const layer of order) {
      const listening = layers[layer](_handler());
      try {
        const got = await _round(listening, quick);
        samples[layer].trivial.push(...got.trivial);
        samples[layer].upload.push(...got.upload);
        samples[layer].download.push(...got.download);
      } finally {
        await listening.stop();
      }
    }
  }
  const rows: BenchRow[] = [];
  for (const layer of Object.keys(layers) as Layer[]) {
    const s = samples[layer];
    rows.push(row(`${layer}: trivial POST, keep-alive`, "ms", s.trivial));
    rows.push(row(`${layer}: 64 MiB request (BYOB into one buffer)`, "ms", s.upload));
    rows.push(row(`${layer}: 64 MiB answer (1 MiB chunks)`, "ms", s.download));
  }
  console.log(table(rows));
  const ratio = (key: "trivial" | "upload" | "download") =>
    (summarize(samples["http1_server.ts"][key]).median /
      summarize(samples["Deno.serve"][key]).median).toFixed(3);
  console.log(
    `http1_server.ts / Deno.serve, medians: trivial ${ratio("trivial")}, ` +
      `64 MiB request ${ratio("upload")}, 64 MiB answer ${ratio("download")}`,
  );
}
