/**
 * The worker interpreter's facts that starting workers needs, read once at startup by running it.
 *
 * @module
 */

/** Facts about the worker interpreter, read once at startup. */
export interface PythonInfo {
  /** The interpreter to start (`sys.executable`: a virtual environment's own, not resolved). */
  executable: string;
  /** `sys.prefix`. */
  prefix: string;
  /** `sys.base_prefix`. */
  basePrefix: string;
  /** Absolute entries of `sys.path` (the user site included when the interpreter uses it). */
  path: string[];
  /** The user site-packages directory when it is on `sys.path`, else `null`. */
  userSite: string | null;
  /** The user base (`site.getuserbase()`) that goes with `userSite`, else `null`. */
  userBase: string | null;
  /** `X.Y.Z`. */
  version: string;
}

/**
 * Reads the worker interpreter's facts as it reports them (a virtual environment keeps its own
 * `bin/python`); `env` is the workers' environment (default: this one's): it decides the user
 * site.
 */
export async function pythonInfo(
  python: string,
  env?: Record<string, string>,
): Promise<PythonInfo> {
  const code = [
    "import json,sys,os,site",
    "u=site.getusersitepackages() if site.ENABLE_USER_SITE else None",
    "u=u if u and u in sys.path else None",
    "print(json.dumps({'executable':sys.executable,'prefix':sys.prefix," +
    "'basePrefix':sys.base_prefix,'path':[p for p in sys.path if p.startswith('/')]," +
    "'userSite':u,'userBase':site.getuserbase() if u else None," +
    "'version':sys.version.split()[0]}))",
  ].join("\n");
  const output = await new Deno.Command(python, {
    args: ["-c", code],
    stdout: "piped",
    stderr: "piped",
    ...(env ? { env, clearEnv: true } : {}),
  }).output().catch((error) => {
    throw new Error(`cannot run the worker interpreter ${python}: ${error.message}`);
  });
  if (!output.success) {
    throw new Error(
      `the worker interpreter ${python} failed: ${new TextDecoder().decode(output.stderr).trim()}`,
    );
  }
  const info = JSON.parse(new TextDecoder().decode(output.stdout)) as PythonInfo;
  // sys.executable can be empty when Python cannot tell; then keep what we were given.
  return { ...info, executable: info.executable || python };
}
