/**
 * Server configuration: the `ServerConfig` type and its validation, both produced from the one
 * table of server options ({@link ./config_options.ts}).
 *
 * @module
 */
import { serverConfigOptions, serverConfigRules } from "./config_options.ts";
import { type OptionTableSchema, optionTableSchema } from "../options/schema.ts";
import type { OptionTableValues } from "../options/spec.ts";

export { defaultDiskCacheDir } from "./config_options.ts";

/**
 * The configuration of one KCoral server (the fields of upstream `ServerConfig`): one field per
 * entry of {@linkcode serverConfigOptions}, documented there.
 */
export type ServerConfig = OptionTableValues<typeof serverConfigOptions>;

/** Defaults and validation of server configurations, from the option table and its rules. */
export const serverConfigSchema: OptionTableSchema<ServerConfig> = optionTableSchema(
  serverConfigOptions,
  serverConfigRules,
);

/** A configuration that cannot be used; the message names the field. */
export class ConfigError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/**
 * Fills in defaults and validates a (partial) configuration. Throws {@linkcode ConfigError}:
 * `invalid server configuration: FIELD: PROBLEM` for a bad field, or the broken rule's message
 * (`--sandbox-readonly-path requires --sandbox bubblewrap`).
 *
 * @example Defaults
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveServerConfig } from "./config.ts";
 * const config = resolveServerConfig({ device: "cpu", numWorkers: 2 });
 * assert.equal(config.maxRequestsPerWorker, 1);
 * ```
 */
export function resolveServerConfig(input: Partial<ServerConfig> = {}): ServerConfig {
  const checked = serverConfigSchema.check(input);
  if (checked.ok) return checked.values;
  const problem = checked.problems[0];
  throw new ConfigError(
    problem.rule
      ? `${problem.flag} ${problem.message}`
      : `invalid server configuration: ${problem.path || "config"}: ${problem.message}`,
  );
}

/** Number of distinct configured GPUs (0 on a CPU server). */
export function distinctGpuCount(config: ServerConfig): number {
  return config.device === "gpu" ? new Set(config.gpus).size : 0;
}
