/**
 * `kcoral run TOOL`: argument parsing and validation, `--send` packing, the uploaded
 * Python runner sources, the program, execution, output replay, exit status and progress.
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
export {
  type PackedFile,
  type PackedInputs,
  PackError,
  packInputs,
  type PackOptions,
  type PackProgress,
} from "./pack.ts";
export { readToolSources, type ToolSources } from "./sources.ts";
export { isToolName, TOOL_NAMES, type ToolInfo, type ToolName, TOOLS } from "./tools.ts";
export { dispatcherHelp, toolHelp } from "./usage.ts";
export { runMain } from "./main.ts";
export { describeError, type RunIO, runTool } from "./execute.ts";
export { type ByteSink, MemorySink, writeText } from "./io.ts";
export { decodeOutcome, exitStatus, type ToolOutcome } from "./outcome.ts";
export { assertNewOutput, OutputExistsError, prepareOutput } from "./output.ts";
export {
  ARTIFACTS_KEY,
  buildToolProgram,
  OUTCOME_KEY,
  type ToolProgram,
  type ToolProgramArgs,
} from "./program.ts";
export {
  describePacking,
  formatBytes,
  formatElapsed,
  Progress,
  type ProgressOptions,
} from "./progress.ts";
export { RemoteFailure, replayResult, type ReplayTarget } from "./replay.ts";
export {
  describeWait,
  parseLoad,
  type ServerLoad,
  type Watch,
  type WatchOptions,
  watchWaiting,
} from "./watch.ts";
