/**
 * Command lines from options tables (with commander): the flags, `--help` (defaults and
 * environment variables included, hidden entries left out), environment variables for flags
 * not given (an explicit flag wins), and `requires` between options. As with argparse, a
 * malformed command line is exit status 2 and a well-formed one with an invalid setting is 1.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable } from "./spec.ts";
 * import { optionTableSchema } from "./schema.ts";
 * import { checkCommandLineValues, parseCommandLine } from "./command.ts";
 *
 * const exampleOptions = {
 *   port: { flag: "--port", env: "EXAMPLE_PORT", type: "int", min: 1, max: 65535, default: 9000,
 *     placeholder: "port", help: "listen port" },
 * } as const satisfies OptionTable;
 * const exampleCommand = { name: "example", description: "An example." };
 *
 * const parsed = parseCommandLine([], exampleOptions, exampleCommand, { EXAMPLE_PORT: "9001" });
 * if (parsed.kind === "help") throw new Error("no help was asked for");
 * assert.ok(parsed.values.port === 9001 && parsed.sources.port === "env");
 * const values = checkCommandLineValues(optionTableSchema(exampleOptions), parsed.values);
 * assert.equal(values.port, 9001);
 * ```
 *
 * @module
 */
import { Command, CommanderError, Option } from "commander";
import { resolveOptionDefault } from "./defaults.ts";
import { describeOption, optionFlags } from "./help.ts";
import { helpRow, usageLines, wrapText } from "./help_layout.ts";
import { assertOptionTable, type OptionTableSchema } from "./schema.ts";
import type { Env, OptionField, OptionSpec, OptionTable, OptionTableValues } from "./spec.ts";
import { OptionTextError, readOptionText } from "./text.ts";

/** How a command presents itself in `--help` and in error messages. */
export interface CommandLineSpec {
  /** The command as usage shows it and errors start: `"kcoral server"`. */
  readonly name: string;
  /** The line under the usage. */
  readonly description: string;
  /** Text after the options. */
  readonly epilog?: string;
  /** The version `--version` prints (`kcoral 0.1.0`); no `--version` without it. */
  readonly version?: string;
  /**
   * Option groups of `--help`, each under its title (argparse's argument groups), by flag;
   * visible options in no group are listed last, under "other options".
   */
  readonly groups?: readonly { readonly title: string; readonly flags: readonly string[] }[];
  /** Lines `--help` shows under "examples:": command lines, each after a `# what it does`. */
  readonly examples?: readonly string[];
}

/** Where an option's value came from. */
export type OptionSource = "flag" | "env" | "default";

/** A well-formed command line: what it sets, not yet validated nor completed with defaults. */
export interface CommandLineValues<V> {
  /** Says what this is. */
  readonly kind: "values";
  /**
   * The fields the command line sets: those given by flag or environment variable, those with
   * a command-line default (`commandDefault`), and every boolean.
   */
  readonly values: Partial<V>;
  /** Where each field of `values` came from. */
  readonly sources: Readonly<Partial<Record<keyof V & string, OptionSource>>>;
}

/** `-h`/`--help` (or `--version`) was given: `text` is what to print (exit status 0). */
export interface CommandLineHelp {
  /** Says what this is. */
  readonly kind: "help";
  /** The help text. */
  readonly text: string;
}

/** The command line cannot be used; `exitCode` is 2 (malformed) or 1 (invalid setting). */
export class CommandLineError extends Error {
  /** The process exit status to use. */
  readonly exitCode: number;
  /** Creates the error. */
  constructor(message: string, exitCode: number) {
    super(message);
    this.name = "CommandLineError";
    this.exitCode = exitCode;
  }
}

/**
 * Parses `argv` (the arguments after the command's name) with the options of `table`.
 * Environment variables in `env` fill in flags that were not given. Throws
 * {@linkcode CommandLineError} with exit status 2 for a malformed command line (unknown option,
 * unreadable value, extra argument, an option given without the one it `requires`), with the
 * message prefixed by `NAME: error: `.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable } from "./spec.ts";
 * import { CommandLineError, parseCommandLine } from "./command.ts";
 *
 * const exampleOptions = {
 *   router: { flag: "--router", type: "string", nullable: true, default: null, help: "router" },
 *   jitter: { flag: "--jitter", type: "number", min: 0, max: 0.5, default: 0.2, hidden: true,
 *     requires: "router", help: "restart jitter" },
 * } as const satisfies OptionTable;
 * const exampleCommand = { name: "example", description: "An example." };
 *
 * assert.throws(
 *   () => parseCommandLine(["--jitter", "0"], exampleOptions, exampleCommand, {}),
 *   new CommandLineError("example: error: --jitter requires --router", 2),
 * );
 * const help = parseCommandLine(["--help"], exampleOptions, exampleCommand, {});
 * assert.ok(help.kind === "help" && !help.text.includes("--jitter"));
 * ```
 */
export function parseCommandLine<T extends OptionTable>(
  argv: readonly string[],
  table: T,
  spec: CommandLineSpec,
  env: Env,
): CommandLineValues<OptionTableValues<T>> | CommandLineHelp {
  const { command, options } = commandOf(table, spec, env);
  try {
    command.parse([...argv], { from: "user" });
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.code === "commander.helpDisplayed" || error.code === "commander.help") {
        return { kind: "help", text: helpText(table, spec, env) };
      }
      if (error.code === "commander.version") return { kind: "help", text: spec.version! };
      const unknown = error.code === "commander.unknownOption"
        ? /unknown option '([^']*)'/.exec(error.message)
        : null;
      if (unknown) {
        // argparse's words, as every other kcoral command says it.
        throw new CommandLineError(
          `${spec.name}: error: unrecognized arguments: ${unknown[1]}`,
          2,
        );
      }
      throw new CommandLineError(`${spec.name}: error: ${_argparseWords(error.message)}`, 2);
    }
    throw error;
  }
  const values: Record<string, unknown> = {};
  const sources: Record<string, OptionSource> = {};
  for (const [field, option] of options) {
    const entry = table[field];
    const attribute = option.attributeName();
    const text = entry.env === undefined ? undefined : env[entry.env];
    if (command.getOptionValueSource(attribute) === "cli") {
      values[field] = command.getOptionValue(attribute);
      sources[field] = "flag";
    } else if (text !== undefined && entry.type !== "boolean") {
      try {
        values[field] = readOptionText(entry, text);
      } catch (error) {
        if (!(error instanceof OptionTextError)) throw error;
        throw new CommandLineError(
          `${spec.name}: error: argument ${entry.env}: ${error.message}`,
          2,
        );
      }
      sources[field] = "env";
    } else if (entry.commandDefault !== undefined || entry.type === "boolean") {
      values[field] = resolveOptionDefault<unknown>(entry.commandDefault ?? entry.default, env);
      sources[field] = "default";
    }
  }
  for (const [field, entry] of Object.entries(table)) {
    const needed = entry.requires;
    if (needed === undefined || !given(sources[field]) || given(sources[needed])) continue;
    throw new CommandLineError(
      `${spec.name}: error: ${entry.flag} requires ${table[needed].flag}`,
      2,
    );
  }
  return {
    kind: "values",
    values: values as Partial<OptionTableValues<T>>,
    sources: sources as Partial<Record<OptionField<T>, OptionSource>>,
  };
}

/**
 * The `--help` text of a command with the options of `table` (the text `parseCommandLine`
 * returns for `--help`), laid out as argparse does (options/help_layout.ts). It starts with
 * {@linkcode commandLineUsage}.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { commandLineHelp } from "./command.ts";
 *
 * const help = commandLineHelp({
 *   host: { flag: "--host", env: "EXAMPLE_HOST", type: "string", default: "127.0.0.1",
 *     placeholder: "host", help: "bind address" },
 * }, { name: "example", description: "An example." }, {});
 * assert.equal(help.split("\n")[0], "usage: example [-h] [--host HOST]");
 * assert.ok(help.includes("  --host HOST           bind address (default 127.0.0.1) [env:"));
 * ```
 */
export function commandLineHelp(table: OptionTable, spec: CommandLineSpec, env: Env): string {
  assertOptionTable(table);
  return helpText(table, spec, env);
}

/**
 * The usage lines of a command (ends with a newline): what a malformed command line's error
 * is printed after, as argparse does.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { commandLineUsage } from "./command.ts";
 *
 * const usage = commandLineUsage({
 *   mode: { flag: "--mode", type: "choice", choices: ["fast", "safe"], default: "safe",
 *     help: "mode" },
 *   quiet: { flag: "--quiet", type: "boolean", default: false, help: "less output" },
 * }, { name: "example", description: "An example.", version: "example 1.0" });
 * assert.equal(usage, "usage: example [-h] [--version] [--mode {fast,safe}] [--quiet]\n");
 * ```
 */
export function commandLineUsage(table: OptionTable, spec: CommandLineSpec): string {
  const groups = ["[-h]", ...(spec.version ? ["[--version]"] : [])];
  for (const entry of Object.values(table)) {
    if (!entry.hidden) groups.push(`[${_invocation(entry)}]`);
  }
  return usageLines(spec.name, groups);
}

/**
 * Completes command-line `values` with the defaults of `schema` and validates them; the
 * validated values, or {@linkcode CommandLineError} with exit status 1 and the problem after
 * the option's flag (`--num-workers must be at least 1`). `env` feeds computed defaults.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable } from "./spec.ts";
 * import { optionTableSchema } from "./schema.ts";
 * import { checkCommandLineValues, CommandLineError } from "./command.ts";
 *
 * const schema = optionTableSchema({
 *   workers: { flag: "--workers", type: "int", min: 1, default: 4, help: "workers" },
 * } as const satisfies OptionTable);
 * assert.equal(checkCommandLineValues(schema, {}).workers, 4);
 * assert.throws(
 *   () => checkCommandLineValues(schema, { workers: 0 }),
 *   new CommandLineError("--workers must be at least 1", 1),
 * );
 * ```
 */
export function checkCommandLineValues<V>(
  schema: OptionTableSchema<V>,
  values: Readonly<Partial<V>>,
  env?: Env,
): V {
  const checked = schema.check(values, env);
  if (checked.ok) return checked.values;
  const problem = checked.problems[0];
  throw new CommandLineError(`${problem.flag ?? problem.path} ${problem.message}`, 1);
}

function given(source: OptionSource | undefined): boolean {
  return source === "flag" || source === "env";
}

function commandOf(
  table: OptionTable,
  spec: CommandLineSpec,
  env: Env,
): { command: Command; options: Map<string, Option> } {
  assertOptionTable(table);
  const command = new Command(spec.name)
    .description(spec.description)
    .helpOption("-h, --help", "show this help message and exit")
    .allowExcessArguments(false)
    .exitOverride()
    .configureOutput({ writeOut: () => {}, writeErr: () => {} });
  const options = new Map<string, Option>();
  const attributes = new Set<string>();
  for (const [field, entry] of Object.entries(table)) {
    const option = new Option(optionFlags(entry), describeOption(entry, env));
    if (attributes.has(option.attributeName())) {
      throw new TypeError(`options table: ${field} (${entry.flag}): flag clashes with another`);
    }
    attributes.add(option.attributeName());
    if (entry.hidden) option.hideHelp();
    if (entry.type === "choice") option.choices(entry.choices);
    else if (entry.type !== "boolean" && entry.type !== "string") {
      option.argParser((text: string, previous: unknown) => {
        try {
          return readOptionText(entry, text, previous);
        } catch (error) {
          if (!(error instanceof OptionTextError)) throw error;
          // Reported as commander reports its own errors: exit status 2.
          const message = `argument ${entry.flag}: ${error.message}`;
          throw new CommanderError(2, "kcoral.invalidArgument", message);
        }
      });
    }
    command.addOption(option);
    options.set(field, option);
  }
  if (spec.version) command.version(spec.version, "--version");
  return { command, options };
}

/**
 * commander's messages in argparse's words, the voice of every kcoral command:
 * `argument --device: invalid choice: 'tpu' (choose from 'gpu', 'cpu')`,
 * `argument --port: expected one argument`.
 */
function _argparseWords(message: string): string {
  const text = message.replace(/^error: /, "");
  const choice = /^option '(\S+)[^']*' argument '([^']*)' is invalid\. Allowed choices are (.*)\.$/
    .exec(text);
  if (choice) {
    const choices = choice[3].split(", ").map((c) => `'${c}'`).join(", ");
    return `argument ${choice[1]}: invalid choice: '${choice[2]}' (choose from ${choices})`;
  }
  const missing = /^option '(\S+)[^']*' argument missing$/.exec(text);
  if (missing) return `argument ${missing[1]}: expected one argument`;
  return text;
}

/** `--port PORT`, `--device {gpu,cpu}`, or the bare flag of a switch (argparse's metavars). */
function _invocation(entry: OptionSpec): string {
  if (entry.type === "boolean") return entry.flag;
  if (entry.type === "choice") return `${entry.flag} {${entry.choices.join(",")}}`;
  const name = entry.placeholder === "s" ? "seconds" : entry.placeholder ?? "value";
  return `${entry.flag} ${name.toUpperCase().replace(/[^A-Z0-9]+/g, "_")}`;
}

function helpText(table: OptionTable, spec: CommandLineSpec, env: Env): string {
  const rows = [helpRow("  -h, --help", "show this help message and exit")];
  if (spec.version) rows.push(helpRow("  --version", "show program's version number and exit"));
  const row = (entry: OptionSpec) => helpRow(`  ${_invocation(entry)}`, describeOption(entry, env));
  const visible = Object.values(table).filter((entry) => !entry.hidden);
  const lines = [commandLineUsage(table, spec), ...wrapText(spec.description, 0), "", "options:"];
  if (spec.groups === undefined) {
    lines.push(...rows, ...visible.map(row));
  } else {
    lines.push(...rows);
    const grouped = new Set(spec.groups.flatMap((group) => group.flags));
    const groups = [
      ...spec.groups.map((group) => ({
        title: group.title,
        entries: group.flags.map((flag) => visible.find((entry) => entry.flag === flag))
          .filter((entry) => entry !== undefined),
      })),
      { title: "other options", entries: visible.filter((entry) => !grouped.has(entry.flag)) },
    ];
    for (const group of groups) {
      if (group.entries.length > 0) lines.push("", `${group.title}:`, ...group.entries.map(row));
    }
  }
  if (spec.examples !== undefined && spec.examples.length > 0) {
    lines.push("", "examples:", ...spec.examples.map((example) => `  ${example}`));
  }
  if (spec.epilog !== undefined) lines.push("", ...wrapText(spec.epilog, 0));
  return lines.join("\n") + "\n";
}
