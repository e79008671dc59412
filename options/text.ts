/**
 * Reading an option's value from text (a command-line argument or an environment variable),
 * as argparse reads `type=int` / `type=float` / comma lists: text that is not a value of the
 * option's kind is a malformed command line. Limits are not checked here (a well-formed but
 * out-of-range value is an invalid setting, reported by the schema), except inside lists
 * split from one argument, where an element out of range makes the list unreadable.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { readOptionText } from "./text.ts";
 *
 * assert.equal(readOptionText({ type: "int" }, " 12 "), 12);
 * const gpus = readOptionText({ type: "list", items: { type: "int", min: 0 }, separator: "," }, "0, 1,");
 * assert.deepEqual(gpus, [0, 1]);
 * ```
 *
 * @module
 */
import type {
  ChoiceValue,
  IntValue,
  ListValue,
  NumberLimits,
  NumberValue,
  StringValue,
} from "./spec.ts";

/** Text that is no value of the option's kind; the message says why (`invalid int value: 'x'`). */
export class OptionTextError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "OptionTextError";
  }
}

/** The kinds of value text can give: all but booleans, which flags alone set. */
export type TextOption = IntValue | NumberValue | StringValue | ChoiceValue | ListValue;

/**
 * The value `text` gives option `spec`. For a repeated list flag, `previous` is what the earlier
 * repetitions gave and the result appends to it. Throws {@linkcode OptionTextError}.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { OptionTextError, readOptionText } from "./text.ts";
 *
 * const paths = readOptionText({ type: "list", items: { type: "string" } }, "/b", ["/a"]);
 * assert.deepEqual(paths, ["/a", "/b"]);
 * assert.throws(
 *   () => readOptionText({ type: "number" }, "abc"),
 *   new OptionTextError("invalid float value: 'abc'"),
 * );
 * ```
 */
export function readOptionText(spec: TextOption, text: string, previous?: unknown): unknown {
  switch (spec.type) {
    case "int":
      if (!/^[+-]?\d+$/.test(text.trim())) {
        throw new OptionTextError(`invalid int value: '${text}'`);
      }
      return Number(text);
    case "number": {
      const value = Number(text);
      if (text.trim() === "" || !Number.isFinite(value)) {
        throw new OptionTextError(`invalid float value: '${text}'`);
      }
      return value;
    }
    case "string":
      return text;
    case "choice":
      if (!spec.choices.includes(text)) {
        throw new OptionTextError(
          `invalid choice: '${text}' (choose from ${spec.choices.join(", ")})`,
        );
      }
      return text;
    case "list": {
      if (spec.separator === undefined) {
        return [...(Array.isArray(previous) ? previous : []), readOptionText(spec.items, text)];
      }
      const listName = spec.listName ??
        `${spec.items.type === "number" ? "float" : spec.items.type} list`;
      const items = text.split(spec.separator).map((s) => s.trim()).filter((s) => s !== "");
      try {
        return items.map((item) => {
          const value = readOptionText(spec.items, item);
          if (spec.items.type !== "string" && !withinLimits(value as number, spec.items)) {
            throw new OptionTextError(`out of range: ${item}`);
          }
          return value;
        });
      } catch (error) {
        if (error instanceof OptionTextError) {
          throw new OptionTextError(`invalid ${listName}: '${text}'`);
        }
        throw error;
      }
    }
  }
}

function withinLimits(value: number, { min, max, above }: NumberLimits): boolean {
  return (min === undefined || value >= min) && (max === undefined || value <= max) &&
    (above === undefined || value > above);
}
