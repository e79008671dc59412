import assert from "node:assert/strict";
import {
  boundaryBytes,
  boundaryFromContentType,
  boundaryOccursIn,
  closingDelimiter,
  delimiterMarkPattern,
  encodeMultipart,
  encodeMultipartChunks,
  MultipartError,
  newBoundary,
  parseMultipart,
  PART_SEPARATOR,
  partHeader,
} from "./mod.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

function bytes(text: string): Uint8Array {
  // Latin-1: each char one byte, so tests can place arbitrary bytes.
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

function parts(body: string, boundary = "B"): [string, string, string][] {
  return parseMultipart(bytes(body), boundary).map((p) => [
    p.name,
    p.mediaType,
    String.fromCharCode(...p.body),
  ]);
}

const H =
  'Content-Disposition: form-data; name="p"\r\nContent-Type: application/octet-stream\r\n\r\n';

Deno.test("multipart: canonical CRLF body, preamble and epilogue", () => {
  assert.deepEqual(parts(`--B\r\n${H}abc\r\n--B--\r\n`), [[
    "p",
    "application/octet-stream",
    "abc",
  ]]);
  assert.deepEqual(parts(`preamble\r\nmore\r\n--B\r\n${H}abc\r\n--B--\r\nepilogue --B\r\n`), [[
    "p",
    "application/octet-stream",
    "abc",
  ]]);
  // A preamble must end with LF before the first delimiter.
  assert.throws(
    () => parts(`preamble--B\r\n${H}abc`),
    /^MultipartError: malformed multipart\/form-data body$/,
  );
  assert.throws(
    () => parts(`preamble--B\r\n${H}abc\r\n--B--`),
    /^MultipartError: multipart body has no parts$/,
  );
});

Deno.test("multipart: LF-only line endings everywhere", () => {
  const body =
    '--B\nContent-Disposition: form-data; name="a"\nContent-Type: text/plain\n\nx\ny\n--B\n' +
    'Content-Disposition: form-data; name="b"\nContent-Type: text/plain\n\n\n--B--\n';
  assert.deepEqual(parts(body), [["a", "text/plain", "x\ny"], ["b", "text/plain", ""]]);
});

Deno.test("multipart: closing delimiter at end of body without CRLF, and transport padding", () => {
  assert.deepEqual(parts(`--B\r\n${H}abc\r\n--B--`), [["p", "application/octet-stream", "abc"]]);
  assert.deepEqual(parts(`--B \t\r\n${H}abc\r\n--B-- \t`), [[
    "p",
    "application/octet-stream",
    "abc",
  ]]);
  // A non-closing delimiter cannot end the body.
  assert.throws(() => parts(`--B\r\n${H}abc\r\n--B`), /malformed multipart\/form-data body/);
});

Deno.test("multipart: boundary-like bytes inside a payload stay payload", () => {
  const payload = "x\r\n--Bx\r\n--B--y\n--BB\r\n-B\r\n\r\n--B\t!\r\n";
  assert.deepEqual(parts(`--B\r\n${H}${payload}\r\n--B--\r\n`), [[
    "p",
    "application/octet-stream",
    payload,
  ]]);
});

Deno.test("multipart: only one CR before the delimiter's LF is dropped; empty payloads", () => {
  assert.deepEqual(parts(`--B\r\n${H}abc\r\r\n--B--`), [[
    "p",
    "application/octet-stream",
    "abc\r",
  ]]);
  assert.deepEqual(parts(`--B\r\n${H}\r\n--B--`), [["p", "application/octet-stream", ""]]);
  // Without the separator line the blank line is missing: the headers never end.
  assert.throws(
    () => parts(`--B\r\n${H.slice(0, -2)}\r\n--B--`),
    /^MultipartError: malformed multipart part headers$/,
  );
});

Deno.test("multipart: delimiter at byte 0 whose line is garbage is skipped", () => {
  assert.deepEqual(parts(`--Bx\r\n--B\r\n${H}abc\r\n--B--`), [[
    "p",
    "application/octet-stream",
    "abc",
  ]]);
});

Deno.test("multipart: parts are views into the body", () => {
  const body = bytes(`--B\r\n${H}abc\r\n--B--`);
  const [part] = parseMultipart(body, "B");
  assert.equal(part.body.buffer, body.buffer);
  assert.equal(part.body.byteOffset, body.length - "abc\r\n--B--".length);
});

Deno.test("multipart: strict part headers, each with upstream's message", () => {
  const cd = 'Content-Disposition: form-data; name="p"';
  const ct = "Content-Type: application/json";
  const cases: [string, string | [string, string]][] = [
    [`${cd}\r\n${ct}\r\n`, ["p", "application/json"]],
    [
      `content-disposition: FORM-DATA; NAME=p; filename="x.bin"\r\ncontent-type: Application/JSON; charset=utf-8\r\n`,
      ["p", "application/json"],
    ],
    [`Content-Disposition: form-data;\r\n\tname="folded"\r\n${ct}\r\n`, [
      "folded",
      "application/json",
    ]],
    [`${cd}\r\n${ct}\r\nContent-Transfer-Encoding: Binary\r\n`, ["p", "application/json"]],
    [`${cd}\r\n${ct}\r\nContent-Transfer-Encoding: 8bit\r\n`, ["p", "application/json"]],
    [`${cd}\r\nContent-Type:application/json\r\nX-Other: yes\r\n`, ["p", "application/json"]],
    [`Content-Disposition: form-data; name="a\\"b"\r\n${ct}\r\n`, ['a"b', "application/json"]],
    [`${cd}\r\nno colon here\r\n${ct}\r\n`, "malformed multipart part headers"],
    [` ${cd}\r\n${ct}\r\n`, "malformed multipart part headers"],
    [`${cd}\r\nContent-Type : application/json\r\n`, "malformed multipart part headers"],
    [`${cd}\r\n${ct}\r\nX-Name: caf\u00e9\r\n`, "malformed multipart part headers"],
    [`${ct}\r\n`, "each multipart part must have one Content-Disposition"],
    [`${cd}\r\n${cd}\r\n${ct}\r\n`, "each multipart part must have one Content-Disposition"],
    [`${cd}\r\n`, "each multipart part must have one Content-Type"],
    [`${cd}\r\n${ct}\r\n${ct}\r\n`, "each multipart part must have one Content-Type"],
    [
      `Content-Disposition: form-data; name="p\r\n${ct}\r\n`,
      "multipart part has a malformed Content-Disposition",
    ],
    [
      `Content-Disposition: form-data; name\r\n${ct}\r\n`,
      "multipart part has a malformed Content-Disposition",
    ],
    [
      `Content-Disposition: form data\r\n${ct}\r\n`,
      "multipart part has a malformed Content-Disposition",
    ],
    [`${cd}\r\nContent-Type: json\r\n`, "multipart part has a malformed Content-Type"],
    [
      `${cd}\r\nContent-Type: application/json; charset\r\n`,
      "multipart part has a malformed Content-Type",
    ],
    [
      `${cd}\r\nContent-Type: multipart/mixed; boundary=x\r\n`,
      "nested multipart parts are not supported",
    ],
    [
      `Content-Disposition: attachment; name="p"\r\n${ct}\r\n`,
      "multipart parts must use form-data disposition",
    ],
    [
      `Content-Disposition: form-data; filename="p"\r\n${ct}\r\n`,
      "multipart part is missing its name",
    ],
    [`Content-Disposition: form-data; name=""\r\n${ct}\r\n`, "multipart part is missing its name"],
    [
      `Content-Disposition: form-data; name=a; name=b\r\n${ct}\r\n`,
      "multipart part is missing its name",
    ],
    [
      `${cd}\r\n${ct}\r\nContent-Transfer-Encoding: base64\r\n`,
      "encoded multipart parts are not supported",
    ],
  ];
  for (const [headers, expected] of cases) {
    const body = `--B\r\n${headers}\r\npayload\r\n--B--\r\n`;
    if (Array.isArray(expected)) {
      assert.deepEqual(parts(body)[0].slice(0, 2), expected, headers);
    } else {
      assert.throws(() => parts(body), (error: unknown) => {
        assert.ok(error instanceof MultipartError, headers);
        assert.equal(error.message, expected, headers);
        return true;
      });
    }
  }
});

Deno.test("multipart: framing errors", () => {
  assert.throws(() => parts("--B--\r\n"), /^MultipartError: multipart body has no parts$/);
  assert.throws(() => parts("no delimiter at all"), /malformed multipart\/form-data body/);
  assert.throws(() => parts(`--B\r\n${H}data without end`), /malformed multipart\/form-data body/);
  assert.throws(() => parts(""), /malformed multipart\/form-data body/);
});

Deno.test("boundaryFromContentType: rules of spec §2.1", () => {
  const ok: [string, string][] = [
    ["multipart/form-data; boundary=abc", "abc"],
    ["MULTIPART/FORM-DATA; BOUNDARY=abc", "abc"],
    ['multipart/form-data; boundary="a b:c"', "a b:c"],
    ['multipart/form-data;boundary="abc  "', "abc"],
    ["multipart/form-data; charset=utf-8; boundary=kcoral-0f", "kcoral-0f"],
  ];
  for (const [header, boundary] of ok) assert.equal(boundaryFromContentType(header), boundary);
  const expected = "expected a multipart/form-data request";
  const malformed = "malformed multipart/form-data boundary";
  const bad: [string | null, string][] = [
    [null, expected],
    ["", expected],
    ["application/json", expected],
    ["text/plain; boundary=x", expected],
    ["multipart/form-data", malformed],
    ["multipart/form-data; boundary=", malformed],
    ['multipart/form-data; boundary=""', malformed],
    ['multipart/form-data; boundary="   "', malformed],
    ["multipart/form-dataX; boundary=abc", malformed],
    ["multipart/form-data; boundary=a; boundary=b", malformed],
    ['multipart/form-data; boundary="a\rb"', malformed],
    ['multipart/form-data; boundary="caf\u00e9"', malformed],
    ['multipart/form-data; boundary="abc', malformed],
  ];
  for (const [header, message] of bad) {
    assert.throws(() => boundaryFromContentType(header), (error: unknown) => {
      assert.ok(error instanceof MultipartError);
      assert.equal(error.message, message, String(header));
      return true;
    });
  }
});

Deno.test("encodeMultipart: upstream's exact layout, and the streaming pieces match it", () => {
  const encoded = encodeMultipart([
    { name: "result", contentType: "application/json", body: enc.encode("{}") },
    { name: "return:0", contentType: "application/octet-stream", body: new Uint8Array([0, 255]) },
  ], "kcoral-x");
  assert.equal(encoded.contentType, "multipart/form-data; boundary=kcoral-x");
  assert.equal(
    String.fromCharCode(...encoded.body),
    '--kcoral-x\r\nContent-Disposition: form-data; name="result"\r\nContent-Type: application/json\r\n\r\n{}\r\n' +
      '--kcoral-x\r\nContent-Disposition: form-data; name="return:0"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\xff\r\n' +
      "--kcoral-x--\r\n",
  );
  const streamed = [
    partHeader("kcoral-x", "result", "application/json"),
    enc.encode("{}"),
    PART_SEPARATOR,
    partHeader("kcoral-x", "return:0", "application/octet-stream"),
    new Uint8Array([0, 255]),
    PART_SEPARATOR,
    closingDelimiter("kcoral-x"),
  ];
  assert.deepEqual(new Uint8Array(streamed.flatMap((chunk) => [...chunk])), encoded.body);
  assert.throws(() => partHeader("B", 'a"b', "text/plain"), MultipartError);
  assert.throws(() => partHeader("B", "a", "text/plain\r\nX: y"), MultipartError);
  assert.throws(() => encodeMultipart([]), MultipartError);
});

Deno.test("encodeMultipart: random boundaries round-trip binary payloads", () => {
  const random = new Uint8Array(1 << 20);
  for (let i = 0; i < random.length; i += 65536) {
    crypto.getRandomValues(random.subarray(i, i + 65536));
  }
  const tricky = bytes("\r\n--kcoral-\r\n--\n--kcoral-ffff\r\n".repeat(1000));
  const payloads = [random, new Uint8Array(1 << 20), tricky, new Uint8Array(0)];
  const encoded = encodeMultipart(
    payloads.map((body, i) => ({
      name: `return:${i}`,
      contentType: "application/octet-stream",
      body,
    })),
  );
  const boundary = boundaryFromContentType(encoded.contentType);
  assert.match(boundary, /^kcoral-[0-9a-f]{32}$/);
  const decoded = parseMultipart(encoded.body, boundary);
  assert.equal(decoded.length, 4);
  decoded.forEach((part, i) => {
    assert.equal(part.name, `return:${i}`);
    assert.deepEqual(part.body, payloads[i]);
  });
});

Deno.test("encodeMultipart: the boundary is re-drawn while it occurs in a payload", () => {
  const colliding = "kcoral-" + "ab".repeat(16);
  const payload = enc.encode(`data\r\n--${colliding}--\r\n`);
  assert.ok(boundaryOccursIn(payload, colliding));
  assert.throws(
    () => encodeMultipart([{ name: "x", contentType: "text/plain", body: payload }], colliding),
    /the boundary occurs in a part payload/,
  );
  const original = crypto.getRandomValues;
  let draws = 0;
  crypto.getRandomValues = (<T extends ArrayBufferView | null>(array: T): T => {
    draws++;
    if (draws === 1 && array instanceof Uint8Array) {
      array.fill(0xab);
      return array;
    }
    return original.call(crypto, array as never) as T;
  }) as typeof crypto.getRandomValues;
  try {
    const encoded = encodeMultipart([{ name: "x", contentType: "text/plain", body: payload }]);
    const boundary = boundaryFromContentType(encoded.contentType);
    assert.equal(draws, 2);
    assert.notEqual(boundary, colliding);
    assert.deepEqual(parseMultipart(encoded.body, boundary)[0].body, payload);
  } finally {
    crypto.getRandomValues = original;
  }
});

Deno.test("boundaryOccursIn: only CRLF--boundary counts", () => {
  assert.equal(boundaryOccursIn(enc.encode("\r\n--B"), "B"), true);
  assert.equal(boundaryOccursIn(enc.encode("xx\r\n--Bzz"), "B"), true);
  assert.equal(boundaryOccursIn(enc.encode("\n--B"), "B"), false);
  assert.equal(boundaryOccursIn(enc.encode("\r\n-B"), "B"), false);
  assert.equal(boundaryOccursIn(enc.encode("\r\n--"), "B"), false);
  assert.equal(dec.decode(closingDelimiter("B")), "--B--\r\n");
});

Deno.test("multipart: parsing with precomputed delimiter marks gives the same parts and errors", () => {
  const boundary = "Bnd";
  const pieces = [
    "\r\n--Bnd",
    "\n--Bnd",
    "\n--BndX",
    "--Bnd",
    "\r\n--Bnd--",
    "\n--Bn",
    "data",
    "\r\n",
    "\n",
    'Content-Disposition: form-data; name="a"\r\n',
    "Content-Type: text/plain\r\n\r\n",
    " \t",
  ];
  let seed = 7;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  const encoder = new TextEncoder();
  const outcome = (body: Uint8Array, marks?: number[]) => {
    try {
      return parseMultipart(body, boundary, marks ? { marks } : {}).map((p) => [
        p.name,
        p.mediaType,
        p.body.byteOffset,
        p.body.length,
      ]);
    } catch (error) {
      return `${(error as Error).name}: ${(error as Error).message}`;
    }
  };
  let parsed = 0;
  for (let round = 0; round < 3000; round++) {
    let text = round % 2 === 0
      ? '--Bnd\r\nContent-Disposition: form-data; name="r"\r\nContent-Type: application/json\r\n\r\n'
      : "";
    const count = 1 + Math.floor(next() * 12);
    for (let i = 0; i < count; i++) text += pieces[Math.floor(next() * pieces.length)];
    if (next() < 0.7) text += "\r\n--Bnd--\r\n";
    const body = encoder.encode(text);
    const marks: number[] = [];
    for (let at = text.indexOf("\n--Bnd"); at >= 0; at = text.indexOf("\n--Bnd", at + 1)) {
      marks.push(at);
    }
    const plain = outcome(body);
    assert.deepEqual(outcome(body, marks), plain, JSON.stringify(text));
    if (Array.isArray(plain)) parsed++;
  }
  assert.ok(parsed > 100, `only ${parsed} bodies parsed`); // both outcomes are exercised
});

Deno.test("multipart_encode: newBoundary", () => {
  if (!/^kcoral-[0-9a-f]{32}$/.test(newBoundary())) throw new Error();
});

Deno.test("multipart_encode: boundaryOccursIn", () => {
  const data = new TextEncoder().encode("x\r\n--B");
  if (!boundaryOccursIn(data, "B") || boundaryOccursIn(data, "C")) throw new Error();
});

Deno.test("multipart_encode: partHeader (Stream a body part by part)", async () => {
  const chunks = [
    partHeader("B", "result", "application/json"),
    new TextEncoder().encode("{}"),
    PART_SEPARATOR,
    closingDelimiter("B"),
  ];
  const body = new Uint8Array(await new Blob(chunks).arrayBuffer());
  if (parseMultipart(body, "B")[0].name !== "result") throw new Error();
});

Deno.test("multipart_encode: PART_SEPARATOR", () => {
  if (new TextDecoder().decode(PART_SEPARATOR) !== "\r\n") throw new Error();
});

Deno.test("multipart_encode: closingDelimiter", () => {
  if (new TextDecoder().decode(closingDelimiter("B")) !== "--B--\r\n") throw new Error();
});

Deno.test("multipart_encode: encodeMultipart", () => {
  const data = new Uint8Array([1, 2, 3]);
  const encoded = encodeMultipart([{
    name: "return:0",
    contentType: "application/octet-stream",
    body: data,
  }]);
  const [part] = parseMultipart(encoded.body, boundaryFromContentType(encoded.contentType));
  if (part.name !== "return:0" || part.body.length !== 3) throw new Error();
});

Deno.test("multipart_encode: encodeMultipartChunks", () => {
  const big = new Uint8Array(1 << 20); // checked once, when it was made
  const parts = [{ name: "blob", contentType: "application/octet-stream", body: big }];
  const encoded = encodeMultipartChunks(parts, "B", { scanned: new Set([big]) });
  if (encoded.chunks[1] !== big || !encoded.contentType.endsWith("boundary=B")) throw new Error();
});

Deno.test("multipart_parse: MultipartError", () => {
  try {
    parseMultipart(new TextEncoder().encode("--B--"), "B");
    throw new Error("accepted");
  } catch (error) {
    if (!(error instanceof MultipartError)) throw error;
    if (error.message !== "multipart body has no parts") throw error;
  }
});

Deno.test("multipart_parse: boundaryFromContentType", () => {
  if (boundaryFromContentType('Multipart/Form-Data; boundary="a b"') !== "a b") throw new Error();
});

Deno.test("multipart_parse: delimiterMarkPattern", () => {
  if (new TextDecoder().decode(delimiterMarkPattern("B")) !== "\n--B") throw new Error();
});

Deno.test("multipart_parse: boundaryBytes", () => {
  if (boundaryBytes("--B").length !== 3) throw new Error();
});

Deno.test("multipart_parse: parseMultipart", () => {
  const body = new TextEncoder().encode(
    'preamble\n--B\nContent-Disposition: form-data; name="x"\nContent-Type: text/plain\n\nhi\n--B--',
  );
  const [part] = parseMultipart(body, "B");
  if (part.name !== "x" || new TextDecoder().decode(part.body) !== "hi") throw new Error();
});
