// Codec benchmark: multipart encode + decode of a 256 MiB body (random and
// all-zero payloads), request parsing with blob verification, SHA-256, and the
// strict JSON parse of a program carrying 16 MiB of module source.
//
//   deno run -A bench/codec_bench.ts            # table
//   deno run -A bench/codec_bench.ts --mib 64   # smaller body
//
// The "upstream" column runs the same primitives upstream KCoral's Python
// code uses (bytes.join, `in`/find on bytes, hashlib), measured here with
// python3 when it is available.

import { createHash } from "node:crypto";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import {
  boundaryFromContentType,
  encodeMultipart,
  parseExecuteRequest,
  parseJson,
  parseMultipart,
  sha256Hex,
} from "../protocol/mod.ts";

/** One benchmark result. */
export interface BenchRow {
  /** What was measured. */
  name: string;
  /** Unit of median/min/max (here MB/s, 1 MB = 10^6 bytes). */
  unit: string;
  /** Median over the iterations. */
  median: number;
  /** Slowest iteration's rate. */
  min: number;
  /** Fastest iteration's rate. */
  max: number;
  /** The upstream (Python) anchor for the same work, when measured. */
  upstream?: string;
}

/** Options of {@linkcode runCodecBench}. */
export interface CodecBenchOptions {
  /** Body size in MiB (default 256). */
  mib?: number;
  /** Timed iterations per row (default 5). */
  iterations?: number;
  /** Also measure the Python anchors with python3 (default true). */
  upstream?: boolean;
  /** Run V8's GC before each timed iteration (default true; see `_collector`). */
  collectGarbage?: boolean;
}

function _randomBytes(size: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(size);
  for (let i = 0; i < size; i += 65536) {
    crypto.getRandomValues(out.subarray(i, Math.min(size, i + 65536)));
  }
  return out;
}

/**
 * V8's gc(), so every timed iteration starts with the previous iterations'
 * 256 MiB buffers released. Without it garbage piles up and each new body
 * lands on never-touched memory, whose first-touch page faults cost this VM
 * 3-7x the copy itself (see the note printed with the table).
 */
function _collector(): (() => void) | undefined {
  try {
    setFlagsFromString("--expose-gc");
    return runInNewContext("gc") as () => void;
  } catch {
    return undefined;
  }
}

function _rate(bytes: number, ms: number): number {
  return bytes / 1e6 / (ms / 1000);
}

async function _measure(
  name: string,
  bytes: number,
  iterations: number,
  run: () => unknown | Promise<unknown>,
  gc: (() => void) | undefined,
): Promise<BenchRow> {
  await run(); // warm-up
  const rates: number[] = [];
  for (let i = 0; i < iterations; i++) {
    gc?.();
    const start = performance.now();
    await run();
    rates.push(_rate(bytes, performance.now() - start));
  }
  rates.sort((a, b) => a - b);
  return {
    name,
    unit: "MB/s",
    median: rates[Math.floor(rates.length / 2)],
    min: rates[0],
    max: rates[rates.length - 1],
  };
}

function _check(condition: boolean): void {
  if (!condition) throw new Error("benchmark produced a wrong result");
}

const _PYTHON = `
import hashlib, json, os, secrets, sys, time
size = int(sys.argv[1]); iterations = int(sys.argv[2])
def rate(seconds): return size / 1e6 / seconds
def median(xs): xs = sorted(xs); return xs[len(xs) // 2]
out = {}
for label, data in (("random", os.urandom(size)), ("zeros", bytes(size))):
    rates = []
    for _ in range(iterations):
        t = time.perf_counter()
        boundary = f"kcoral-{secrets.token_hex(16)}"
        assert f"\\r\\n--{boundary}".encode() not in data
        head = f'--{boundary}\\r\\nContent-Disposition: form-data; name="return:0"\\r\\nContent-Type: application/octet-stream\\r\\n\\r\\n'.encode()
        body = b"".join([head, data, b"\\r\\n", f"--{boundary}--\\r\\n".encode()])
        found = body.find(b"\\n--" + boundary.encode(), len(head))
        payload = body[len(head):found - 1]  # upstream slices (copies) each payload
        assert len(payload) == size
        rates.append(rate(time.perf_counter() - t))
    out[label] = median(rates)
    if label == "random":
        rates = []
        for _ in range(iterations):
            t = time.perf_counter(); hashlib.sha256(data).hexdigest(); rates.append(rate(time.perf_counter() - t))
        out["sha256"] = median(rates)
line = "def main():\\n    x = [1, 2, 3]\\n    return 'hello world ' * 3\\n"
source = line * ((16 << 20) // len(line))
text = json.dumps({"instructions": [{"op": "upload", "kind": "module", "id": "m", "source": source}]})
rates = []
for _ in range(iterations):
    t = time.perf_counter(); json.loads(text, object_pairs_hook=dict); rates.append(len(text) / 1e6 / (time.perf_counter() - t))
print(out["random"], out["zeros"], out["sha256"], median(rates))
`;

/** The program text of the JSON row: one module of ~16 MiB source (same as the Python anchor). */
function _bigSourceProgram(): string {
  const line = "def main():\n    x = [1, 2, 3]\n    return 'hello world ' * 3\n";
  const source = line.repeat(Math.floor((16 << 20) / line.length));
  return JSON.stringify({ instructions: [{ op: "upload", kind: "module", id: "m", source }] });
}

async function _pythonAnchors(size: number, iterations: number): Promise<number[] | undefined> {
  try {
    const output = await new Deno.Command("python3", {
      args: ["-c", _PYTHON, String(size), String(iterations)],
      stdout: "piped",
      stderr: "null",
    }).output();
    if (!output.success) return undefined;
    return new TextDecoder().decode(output.stdout).trim().split(" ").map(Number);
  } catch {
    return undefined;
  }
}

/**
 * Run the codec benchmark and return its rows (MB/s).
 *
 * @example
 * ```ts ignore
 * import { runCodecBench } from "./codec_bench.ts";
 *
 * for (const row of await runCodecBench({ mib: 16, iterations: 3 })) console.log(row);
 * ```
 */
export async function runCodecBench(options: CodecBenchOptions = {}): Promise<BenchRow[]> {
  const size = (options.mib ?? 256) * 1024 * 1024;
  const iterations = options.iterations ?? 5;
  const payloads: [string, Uint8Array<ArrayBuffer>][] = [
    ["random", _randomBytes(size)],
    ["zeros", new Uint8Array(size)],
  ];
  const rows: BenchRow[] = [];
  const label = `${options.mib ?? 256} MiB`;
  const gc = options.collectGarbage === false ? undefined : _collector();

  for (const [kind, payload] of payloads) {
    rows.push(
      await _measure(`multipart encode+decode, ${label} ${kind}`, size, iterations, () => {
        const encoded = encodeMultipart([
          { name: "return:0", contentType: "application/octet-stream", body: payload },
        ]);
        const parts = parseMultipart(encoded.body, boundaryFromContentType(encoded.contentType));
        _check(parts.length === 1 && parts[0].body.length === payload.length);
      }, gc),
    );
  }
  const [, random] = payloads[0];
  const encoded = encodeMultipart([
    { name: "return:0", contentType: "application/octet-stream", body: random },
  ]);
  const boundary = boundaryFromContentType(encoded.contentType);
  rows.push(
    await _measure(`multipart encode only, ${label} random`, size, iterations, () => {
      _check(
        encodeMultipart([{ name: "x", contentType: "application/octet-stream", body: random }])
          .body.length > size,
      );
    }, gc),
  );
  rows.push(
    await _measure(`multipart decode only, ${label} random`, size, iterations, () => {
      _check(parseMultipart(encoded.body, boundary)[0].body.length === size);
    }, gc),
  );

  const hash = sha256Hex(random);
  const program = new TextEncoder().encode(JSON.stringify({
    instructions: [{ op: "upload", kind: "bytes", blob: hash, id: "b" }],
  }));
  const request = encodeMultipart([
    { name: "program", contentType: "application/json", body: program },
    { name: `blob:${hash}`, contentType: "application/octet-stream", body: random },
  ]);
  rows.push(
    await _measure(
      `parseExecuteRequest (framing + SHA-256 check), ${label}`,
      size,
      iterations,
      () => {
        _check(parseExecuteRequest(request.body, request.contentType).blobs.size === 1);
      },
      gc,
    ),
  );
  rows.push(
    await _measure(`SHA-256 node:crypto createHash, ${label}`, size, iterations, () => {
      _check(createHash("sha256").update(random).digest("hex") === hash);
    }, gc),
  );
  rows.push(
    await _measure(
      `SHA-256 Web Crypto digest, ${label}`,
      size,
      Math.min(iterations, 3),
      async () => {
        _check((await crypto.subtle.digest("SHA-256", random)).byteLength === 32);
      },
      gc,
    ),
  );

  const programText = _bigSourceProgram();
  const programRow = await _measure(
    "program JSON, strict parse, 16 MiB of module source",
    programText.length,
    iterations,
    () => _check(parseJson(programText) instanceof Map),
    gc,
  );
  rows.push(programRow);

  if (options.upstream ?? true) {
    const anchors = await _pythonAnchors(size, Math.min(iterations, 3));
    if (anchors !== undefined) {
      const [pyRandom, pyZeros, pySha, pyJson] = anchors;
      rows[0].upstream = `${pyRandom.toFixed(0)} MB/s (python3 bytes.join + find)`;
      rows[1].upstream = `${pyZeros.toFixed(0)} MB/s (python3 bytes.join + find)`;
      rows[5].upstream = `${pySha.toFixed(0)} MB/s (python3 hashlib)`;
      programRow.upstream = `${pyJson.toFixed(0)} MB/s (python3 json.loads, pairs hook)`;
    }
  }
  return rows;
}

function _table(rows: BenchRow[]): string {
  const header = ["benchmark", "median", "min", "max", "unit", "upstream"];
  const body = rows.map((row) => [
    row.name,
    row.median.toFixed(0),
    row.min.toFixed(0),
    row.max.toFixed(0),
    row.unit,
    row.upstream ?? "",
  ]);
  const widths = header.map((_, i) => Math.max(...[header, ...body].map((line) => line[i].length)));
  return [header, ...body].map((line) => line.map((cell, i) => cell.padEnd(widths[i])).join("  "))
    .join("\n");
}

if (import.meta.main) {
  const mibIndex = Deno.args.indexOf("--mib");
  const mib = mibIndex >= 0 ? Number(Deno.args[mibIndex + 1]) : 256;
  const collectGarbage = !Deno.args.includes("--no-gc");
  console.log(
    `codec benchmark (${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno})`,
  );
  console.log(_table(await runCodecBench({ mib, collectGarbage })));
  console.log(
    collectGarbage
      ? "GC runs before each timed iteration (--no-gc to skip): rates exclude first-touch page faults of memory left by earlier garbage."
      : "No GC between iterations: encode rates include first-touch page faults of fresh memory.",
  );
}
