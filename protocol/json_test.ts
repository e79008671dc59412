import assert from "node:assert/strict";
import { JsonFloat, JsonParseError, parseJson, parseJsonTyped, stringifyJson } from "./mod.ts";
import { pyFloatRepr, pyRepr, pyStrRepr } from "./python_repr.ts";
import { codePointIndex, pySorted } from "./python_str.ts";

// Expected values computed by CPython (tests/fixtures/protocol/python_vectors.py).
const vectors = JSON.parse(
  Deno.readTextFileSync(new URL("../tests/fixtures/protocol/python_vectors.json", import.meta.url)),
);

function fromHex(hex: string): Uint8Array {
  return new Uint8Array((hex.match(/../g) ?? []).map((byte) => parseInt(byte, 16)));
}

Deno.test("strict JSON: every CPython message and value of the vector table", () => {
  assert.ok(vectors.json.length > 60);
  for (const vector of vectors.json) {
    const input = fromHex(vector.input);
    if (vector.error !== undefined) {
      assert.throws(() => parseJsonTyped(input), (error: unknown) => {
        assert.ok(error instanceof JsonParseError, `${vector.input}: ${error}`);
        assert.equal(error.message, vector.error, vector.input);
        return true;
      });
    } else {
      assert.deepEqual(parseJsonTyped(input), parseJsonTyped(vector.ok), vector.input);
    }
  }
});

Deno.test("strict JSON: strings and bytes give the same results", () => {
  assert.deepEqual(
    parseJson('{"a":[1,"é"]}'),
    parseJson(new TextEncoder().encode('{"a":[1,"é"]}')),
  );
  assert.throws(() => parseJson('{"a":1,"a":2}'), /^JsonParseError: duplicate JSON key: 'a'$/);
});

Deno.test("strict JSON: object keys keep text order, integer-like keys included", () => {
  const value = parseJson('{"z":1,"10":2,"2":3,"a":{"1":0,"0":1}}') as Map<string, unknown>;
  assert.deepEqual([...value.keys()], ["z", "10", "2", "a"]);
  assert.deepEqual([...(value.get("a") as Map<string, unknown>).keys()], ["1", "0"]);
  assert.equal(stringifyJson(value), '{"z":1,"10":2,"2":3,"a":{"1":0,"0":1}}');
});

Deno.test("strict JSON: integers beyond 2^53 are bigint, never rounded", () => {
  const [a, b, c, d] = parseJson(
    "[9007199254740991,9007199254740993,-9007199254740993,123456789012345678901234567890]",
  ) as unknown[];
  assert.equal(a, 9007199254740991);
  assert.equal(b, 9007199254740993n);
  assert.equal(c, -9007199254740993n);
  assert.equal(d, 123456789012345678901234567890n);
  assert.equal(
    stringifyJson([b, d]),
    "[9007199254740993,123456789012345678901234567890]",
  );
  // Floats stay numbers; -0 as an integer is 0 as in Python.
  assert.deepEqual(parseJson("[1e400, 2.5, -0]"), [Infinity, 2.5, 0]);
  assert.ok(Object.is(parseJson("-0.0") as number, -0));
});

Deno.test("strict JSON: typed parsing keeps Python's int/float distinction", () => {
  const [int, float, exp] = parseJsonTyped("[30, 30.0, 1e2]") as unknown[];
  assert.equal(int, 30);
  assert.ok(float instanceof JsonFloat && float.value === 30);
  assert.ok(exp instanceof JsonFloat && exp.value === 100);
  assert.equal(stringifyJson([int, float, exp]), "[30,30.0,100.0]");
});

Deno.test("strict JSON: nesting deeper than 1000 levels is rejected, not a stack overflow", () => {
  assert.equal((parseJson("[".repeat(999) + "]".repeat(999)) as unknown[]).length, 1);
  assert.throws(
    () => parseJson("[".repeat(1001) + "]".repeat(1001)),
    /malformed JSON: nesting deeper than 1000 levels/,
  );
});

Deno.test("strict JSON: with maxIntDigits, longer integers are refused as Python refuses them", () => {
  const longest = "7".repeat(4300);
  const limited = (text: string) => parseJson(text, { maxIntDigits: 4300 });
  assert.deepEqual(limited(`[-${longest}]`), [BigInt(`-${longest}`)]);
  // Without it (a result from a worker, which writes any integer): no limit.
  assert.deepEqual(parseJson(`[${longest}7]`), [BigInt(`${longest}7`)]);
  for (const [text, digits] of [[`[${longest}7]`, 4301], [`-${"1".repeat(5000)}`, 5000]] as const) {
    assert.throws(
      () => limited(text),
      new RegExp(
        `^JsonParseError: malformed JSON: Exceeds the limit \\(4300 digits\\) for integer ` +
          `string conversion: value has ${digits} digits; use sys\\.set_int_max_str_digits\\(\\) ` +
          "to increase the limit$",
      ),
    );
  }
});

Deno.test("strict JSON: lone surrogate escapes are accepted, pairs are joined", () => {
  assert.equal(parseJson('"\\ud800"'), "\ud800");
  assert.equal(parseJson('"\\ud83d\\ude00"'), "\u{1f600}");
  assert.equal(parseJson('"\\ud83d\\u0041"'), "\ud83dA");
});

Deno.test("strict JSON: strings with escapes decode whole, as the scan decodes them", () => {
  // Pieces that meet at escapes, escaped quotes and runs of backslashes before a quote.
  const pieces = [
    "a",
    "\n",
    '"',
    "\\",
    "\\\\",
    "/",
    "é",
    "\u{1f600}",
    "\ud800",
    "\t",
    " ",
    "\u2028",
  ];
  let seed = 7;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
  for (let round = 0; round < 300; round++) {
    let text = "";
    for (let i = next() % 40; i > 0; i--) text += pieces[next() % pieces.length];
    const spelled = JSON.stringify(text);
    // The same text spelled with \u escapes and "\/" too.
    const escaped = spelled.replace(
      /[é\u2028/]/g,
      (c) => c === "/" ? "\\/" : `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
    );
    assert.equal(parseJson(spelled), text, spelled);
    assert.equal(parseJson(escaped), text, escaped);
    assert.deepEqual(parseJson(`{${spelled}:[${escaped}]}`), new Map([[text, [text]]]));
  }
  // Errors keep CPython's message and position after a long run of escapes (values by CPython).
  const run = "a\\n".repeat(1000);
  assert.throws(
    () => parseJson(`"${run}\\x"`),
    /^JsonParseError: malformed JSON: Invalid \\escape: line 1 column 3002 \(char 3001\)$/,
  );
  assert.throws(
    () => parseJson(`"${run}\u0001"`),
    /^JsonParseError: malformed JSON: Invalid control character at: line 1 column 3002 \(char 3001\)$/,
  );
  assert.throws(
    () => parseJson(`["${'a\\"'.repeat(10)}`),
    /^JsonParseError: malformed JSON: Unterminated string starting at: line 1 column 2 \(char 1\)$/,
  );
});

Deno.test("stringifyJson: Python's compact json.dumps(ensure_ascii=False) spelling", () => {
  assert.equal(
    stringifyJson({ a: 'é\u{1f600}\n\t\u0001\u007f"\\/', b: [true, false, null] }),
    '{"a":"é\u{1f600}\\n\\t\\u0001\u007f\\"\\\\/","b":[true,false,null]}',
  );
  assert.equal(stringifyJson("\ud800"), '"\\ud800"');
  assert.equal(
    stringifyJson([0.5, 1e-7, 1e16, 1e21, 153.7, -0]),
    "[0.5,1e-07,10000000000000000,1000000000000000000000,153.7,0]",
  );
  assert.equal(stringifyJson(new JsonFloat(1e16)), "1e+16");
  assert.equal(stringifyJson(new Map([["b", 1], ["a", 2]])), '{"b":1,"a":2}');
});

Deno.test("stringifyJson: non-JSON values are TypeErrors", () => {
  for (
    const bad of [
      NaN,
      Infinity,
      -Infinity,
      new JsonFloat(NaN),
      undefined,
      () => 1,
      Symbol("s"),
      new Date(0),
      new Uint8Array(1),
      new Map([[1, 2]]),
      [undefined],
      // deno-lint-ignore no-sparse-arrays
      [1, , 2],
    ]
  ) {
    assert.throws(() => stringifyJson(bad), TypeError, String(bad));
  }
  const cycle: unknown[] = [];
  cycle.push(cycle);
  assert.throws(() => stringifyJson(cycle), /circular/);
  const shared = [1];
  assert.equal(stringifyJson([shared, shared]), "[[1],[1]]");
});

Deno.test("Python repr, float repr and code-point sort match CPython", () => {
  for (const { code_points, repr } of vectors.repr) {
    assert.equal(pyStrRepr(String.fromCodePoint(...code_points)), repr, repr);
  }
  for (const { value, repr } of vectors.float_repr) assert.equal(pyFloatRepr(value), repr);
  assert.deepEqual(pySorted(vectors.sort_input), vectors.sorted);
  assert.equal(
    pyRepr(parseJsonTyped('[null,true,false,1,1.0,"x",{"k":[2.5]}]')),
    "[None, True, False, 1, 1.0, 'x', {'k': [2.5]}]",
  );
  assert.equal(codePointIndex("a\u{1f600}b", 3), 2);
});

Deno.test("json: ParseJsonOptions.maxIntDigits", () => {
  let refused = false;
  try {
    parseJson("1".repeat(4301), { maxIntDigits: 4300 });
  } catch {
    refused = true;
  }
  if (!refused) throw new Error("not refused");
});

Deno.test("json: parseJson (Key order is the text's order, and big integers stay exact)", () => {
  const value = parseJson('{"b":1,"10":2,"2":12345678901234567890}') as Map<string, unknown>;
  if ([...value.keys()].join() !== "b,10,2") throw new Error("order");
  if (value.get("2") !== 12345678901234567890n) throw new Error("bigint");
});

Deno.test("json: parseJsonTyped", () => {
  const [a, b] = parseJsonTyped("[5, 5.0]") as unknown[];
  if (a !== 5 || !(b instanceof JsonFloat)) throw new Error();
});
