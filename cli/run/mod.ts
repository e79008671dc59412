/**
 * Foundation of `kcoral run TOOL`: argument parsing and validation, `--send` packing, and
 * the uploaded Python runner sources.
 *
 * @module
 */

export {
  DEFAULT_OUTPUT_LIMIT_BYTES,
  DEFAULT_TIMEOUT_SECONDS,
  parseRunArgs,
  parseRunDispatcher,
  type RunArgs,
  type RunArgsError,
  type RunArgsOk,
  type RunArgsResult,
  type RunDispatch,
  type RunDispatchResult,
  type RunHelp,
} from "./args.ts";
export { type PackedFile, type PackedInputs, PackError, packInputs } from "./pack.ts";
export { readToolSources, type ToolSources } from "./sources.ts";
export { isToolName, TOOL_NAMES, type ToolInfo, type ToolName, TOOLS } from "./tools.ts";
export { dispatcherHelp, toolHelp } from "./usage.ts";
