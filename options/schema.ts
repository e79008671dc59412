/**
 * The schema an options table defines: fills in the table's defaults and validates a
 * configuration (built with zod from the entries' kinds and limits), then checks the rules that
 * tie options together. Problems name the field (for configuration objects) and the flag (for
 * command lines).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable } from "./spec.ts";
 * import { optionTableSchema } from "./schema.ts";
 *
 * const exampleOptions = {
 *   workers: { flag: "--workers", type: "int", min: 1, default: 4, help: "workers" },
 * } as const satisfies OptionTable;
 * const schema = optionTableSchema(exampleOptions);
 *
 * const good = schema.check({});
 * assert.ok(good.ok && good.values.workers === 4);
 * const bad = schema.check({ workers: 0 });
 * assert.ok(!bad.ok && bad.problems[0].message === "must be at least 1");
 * ```
 *
 * @module
 */
import { z } from "zod";
import { processEnv, resolveOptionDefault } from "./defaults.ts";
import type {
  Env,
  ListItem,
  NumberLimits,
  OptionSpec,
  OptionTable,
  OptionTableValues,
} from "./spec.ts";

/** One thing wrong with a configuration. */
export interface OptionProblem {
  /** The field (and element) at fault, e.g. `"gpus.0"`; `""` for the whole configuration. */
  readonly path: string;
  /** The flag of the option at fault; absent for unknown fields. */
  readonly flag?: string;
  /** What is wrong, e.g. `"must be at least 1"`. */
  readonly message: string;
  /** `true` when a {@linkcode OptionRule} (a relation between options) is broken. */
  readonly rule: boolean;
}

/** The outcome of {@linkcode OptionTableSchema.check}. */
export type OptionCheck<V> =
  | { readonly ok: true; readonly values: V }
  | { readonly ok: false; readonly problems: readonly [OptionProblem, ...OptionProblem[]] };

/** A relation between options, checked once every field is valid on its own. */
export interface OptionRule<V> {
  /** The field to blame (its flag starts the command line's message). */
  readonly field: keyof V & string;
  /** What is wrong when the rule does not hold, e.g. `"requires --sandbox bubblewrap"`. */
  readonly problem: string;
  /** Whether `values` satisfy the rule. */
  holds(values: V): boolean;
}

/** Validation of configurations `V` against an options table. */
export interface OptionTableSchema<V> {
  /** Every field's default (computed ones from `env`, by default the process's). */
  defaults(env?: Env): V;
  /**
   * Fills in the defaults of missing (or `undefined`) fields, validates every field, refuses
   * unknown fields, then checks the rules. `env` (by default the process's, read only when a
   * computed default needs it) feeds computed defaults.
   */
  check(input: Readonly<Partial<V>>, env?: Env): OptionCheck<V>;
}

/**
 * The schema of an options table, with its rules.
 *
 * @example A rule
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable, OptionTableValues } from "./spec.ts";
 * import { type OptionRule, optionTableSchema } from "./schema.ts";
 *
 * const exampleOptions = {
 *   min: { flag: "--min", type: "int", default: 1, help: "lower bound" },
 *   max: { flag: "--max", type: "int", default: 2, help: "upper bound" },
 * } as const satisfies OptionTable;
 * const rules: OptionRule<OptionTableValues<typeof exampleOptions>>[] = [
 *   { field: "max", problem: "must not be below --min", holds: (v) => v.max >= v.min },
 * ];
 * const checked = optionTableSchema(exampleOptions, rules).check({ min: 5 });
 * assert.ok(!checked.ok && checked.problems[0].flag === "--max" && checked.problems[0].rule);
 * ```
 */
export function optionTableSchema<T extends OptionTable>(
  table: T,
  rules: readonly OptionRule<OptionTableValues<T>>[] = [],
): OptionTableSchema<OptionTableValues<T>> {
  type V = OptionTableValues<T>;
  assertOptionTable(table);
  const entries = Object.entries(table);
  const shape = Object.fromEntries(entries.map(([field, spec]) => [field, optionSchema(spec)]));
  const object = z.object(shape).strict();
  const flagOf = (path: PropertyKey[]) => table[String(path[0])]?.flag;
  return {
    defaults(env?: Env): V {
      const readEnv = lazyEnv(env);
      const values: Record<string, unknown> = {};
      for (const [field, spec] of entries) values[field] = defaultOf(spec, readEnv);
      return values as V;
    },
    check(input: Readonly<Partial<V>>, env?: Env): OptionCheck<V> {
      const readEnv = lazyEnv(env);
      const filled: Record<string, unknown> = { ...input };
      for (const [field, spec] of entries) {
        if (filled[field] === undefined) filled[field] = defaultOf(spec, readEnv);
      }
      const parsed = object.safeParse(filled);
      if (!parsed.success) {
        const [first, ...rest] = parsed.error.issues.map((issue): OptionProblem => ({
          path: issue.path.map(String).join("."),
          flag: flagOf(issue.path),
          message: issue.message,
          rule: false,
        }));
        return { ok: false, problems: [first, ...rest] };
      }
      const values = parsed.data as V;
      const broken = rules.filter((rule) => !rule.holds(values)).map((rule): OptionProblem => ({
        path: rule.field,
        flag: table[rule.field].flag,
        message: rule.problem,
        rule: true,
      }));
      if (broken.length > 0) return { ok: false, problems: [broken[0], ...broken.slice(1)] };
      return { ok: true, values };
    },
  };
}

/**
 * Throws a `TypeError` for a table that cannot work: a fixed default its own entry refuses,
 * `emptyIsNull` without `nullable`, an environment variable on a boolean, a `requires` naming no
 * entry, or two entries sharing a flag.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { assertOptionTable } from "./schema.ts";
 *
 * assert.throws(
 *   () => assertOptionTable({ n: { flag: "--n", type: "int", min: 1, default: 0, help: "n" } }),
 *   TypeError,
 * );
 * ```
 */
export function assertOptionTable(table: OptionTable): void {
  const flags = new Set<string>();
  for (const [field, spec] of Object.entries(table)) {
    const where = `options table: ${field} (${spec.flag})`;
    if (flags.has(spec.flag)) throw new TypeError(`${where}: flag used twice`);
    flags.add(spec.flag);
    if (spec.type === "string" && spec.emptyIsNull && !spec.nullable) {
      throw new TypeError(`${where}: emptyIsNull needs nullable`);
    }
    if (spec.type === "boolean" && spec.env !== undefined) {
      throw new TypeError(`${where}: a boolean option reads no environment variable`);
    }
    if (spec.requires !== undefined && !(spec.requires in table)) {
      throw new TypeError(`${where}: requires unknown field ${spec.requires}`);
    }
    const schema = optionSchema(spec);
    for (const fixed of [spec.default, spec.commandDefault]) {
      if (fixed === undefined || typeof fixed === "function") continue;
      const parsed = schema.safeParse(fixed);
      if (!parsed.success) {
        const problem = parsed.error.issues[0].message;
        throw new TypeError(`${where}: default ${JSON.stringify(fixed)} ${problem}`);
      }
    }
  }
}

/** `env`, or the process's environment read at the first call. */
function lazyEnv(env: Env | undefined): () => Env {
  let read = env;
  return () => read ??= processEnv();
}

/** The default of `spec`; the environment is read only for a computed default. */
function defaultOf(spec: OptionSpec, readEnv: () => Env): unknown {
  const value: unknown = spec.default;
  return resolveOptionDefault(value, typeof value === "function" ? readEnv() : {});
}

function optionSchema(spec: OptionSpec): z.ZodType {
  let schema = valueSchema(spec);
  if (spec.nullable) schema = schema.nullable();
  if (spec.type === "string" && spec.emptyIsNull) {
    schema = schema.transform((value) => value === "" ? null : value);
  }
  return schema;
}

function valueSchema(spec: OptionSpec | ListItem): z.ZodType {
  switch (spec.type) {
    case "int":
      return limited(z.number().int(), spec);
    case "number":
      return limited(z.number(), spec);
    case "string":
      return spec.nonEmpty ? z.string().min(1, "must not be empty") : z.string();
    case "choice":
      return z.enum(spec.choices);
    case "boolean":
      return z.boolean();
    case "list":
      return z.array(valueSchema(spec.items));
  }
}

function limited(schema: z.ZodNumber, limits: NumberLimits): z.ZodNumber {
  const { min, max, above } = limits;
  if (min !== undefined && max !== undefined) {
    const message = `must be between ${min} and ${max}`;
    schema = schema.min(min, message).max(max, message);
  } else if (min !== undefined) {
    schema = schema.min(min, min === 0 ? "must be non-negative" : `must be at least ${min}`);
  } else if (max !== undefined) {
    schema = schema.max(max, `must be at most ${max}`);
  }
  if (above !== undefined) {
    schema = schema.gt(above, above === 0 ? "must be positive" : `must be greater than ${above}`);
  }
  return schema;
}
