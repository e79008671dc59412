/**
 * Input fields shared by `run_python` and `profile` (what to send, the environment, limits)
 * and the structured fields they share in their results.
 *
 * @module
 */
import { z } from "zod";

/** Default `timeout_seconds`. */
export const DEFAULT_TIMEOUT_SECONDS = 300;
/** Default `output_limit_bytes` (1 MiB: the output goes into the agent's context). */
export const DEFAULT_OUTPUT_LIMIT_BYTES = 1 << 20;

/** Fields of a tool's input: what to send and the limits. */
export const sendInputShape = {
  source: z.string().optional().describe(
    "Python source text, sent as main.py in the remote working directory",
  ),
  send: z.array(z.string().min(1)).default([]).describe(
    "local files or directories to upload (relative to the directory kcoral mcp runs in); a " +
      "file is stored under its name, a directory keeps its name: 'exp' gives exp/...",
  ),
  env: z.record(z.string(), z.string()).default({}).describe(
    "environment variables for the remote process (CUDA_VISIBLE_DEVICES and KCORAL_DIR are refused)",
  ),
  timeout_seconds: z.number().int().positive().default(DEFAULT_TIMEOUT_SECONDS).describe(
    "execution deadline in seconds (the server caps it)",
  ),
  output_limit_bytes: z.number().int().positive().default(DEFAULT_OUTPUT_LIMIT_BYTES).describe(
    "capture limit for each of stdout and stderr (the server caps it, by default at 16 MiB)",
  ),
};

/** The exit status fields of a tool result. */
export const exitShape = {
  exit_code: z.number().int().describe(
    "the remote process's exit code; negative -N when it was killed by signal N",
  ),
  missing: z.array(z.string()).describe("requested files that were not produced"),
};
