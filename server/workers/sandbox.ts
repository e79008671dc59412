/**
 * Worker isolation with bubblewrap (spec server §7): the command line that starts a slot's
 * zygote inside its own sandbox (or directly, without isolation), the paths a worker sees, and
 * the startup probe that decides whether isolation is available.
 *
 * Inside a sandbox a slot sees: the runtime read-only (`/usr`, `/lib*`, the Python prefixes
 * and module paths, the runtime package, `--sandbox-readonly-path` entries), the current
 * request's workspace at `/work` (the zygote binds each request's own there: `workspace.ts`),
 * its results directory at `/kcoral/results`, the blob directory read-only at `/kcoral/blobs`,
 * only its own GPU device nodes, and no network. The zygote alone keeps `CAP_SYS_ADMIN`, in the
 * sandbox's user namespace, to switch `/work`; every child drops all capabilities.
 *
 * It stays one module over 400 lines because the bubblewrap argument list and its checks are one
 * ordered construction that the security review reads top to bottom.
 *
 * @module
 */
import { resolve } from "node:path";
import { errorMessage } from "../../protocol/errors.ts";
import type { GpuDevice } from "./devices.ts";
import type { PythonInfo } from "./python_info.ts";
import type { SlotCommand } from "./slot.ts";

/** What a slot's zygote needs to start. */
export interface SlotLaunch {
  /** `"bubblewrap"` or `"none"` (after the probe). */
  sandbox: "bubblewrap" | "none";
  /** Worker interpreter. */
  python: PythonInfo;
  /** Directory that contains the `kcoral_runtime` package. */
  runtimePath: string;
  /** Zygote arguments after `-m kcoral_runtime.zygote`. */
  zygoteArgs: string[];
  /** Host directory of the seat's per-request workspaces (`/kcoral/ws` inside, hidden). */
  workspacesDir: string;
  /** Name of the workspace the zygote binds at `/work` when it starts (sandbox only). */
  workspace: string;
  /** Host directory of the slot's results (`/kcoral/results` inside). */
  resultsDir: string;
  /** Host blob directory, shared by all slots (`/kcoral/blobs` inside, read-only). */
  blobDir: string;
  /** GPUs whose device nodes the slot may open (empty for CPU and simulated GPUs). */
  devices: GpuDevice[];
  /** Extra read-only paths. */
  readonlyPaths: string[];
  /**
   * GPU workers get their device nodes and the NVIDIA control nodes, and keep `/proc` writable
   * (NVIDIA initialization needs it); CPU workers get a read-only `/proc`.
   */
  gpu: boolean;
  /** Base environment (the server's own, minus what must not leak). */
  env: Record<string, string>;
  /** Largest frame taken from the zygote (answers up to the response limit must fit). */
  maxFrameBytes?: number;
  /**
   * The GPU gate's shim (server/workers/gate_library.ts), host path; `null` or absent: no gate.
   * Named to the workers in `KCORAL_GATE_LIB`; inside a sandbox its directory is bound read-only
   * at `/kcoral/gate`.
   */
  gateLibrary?: string | null;
}

/** Paths as a worker inside the slot sees them (its workspace: `SeatWorkspaces.workerPath`). */
export interface WorkerPaths {
  /** Where the child writes result parts and capture files. */
  results: string;
  /** Where input blobs are. */
  blobDir: string;
}

/**
 * A sandbox setting that can never be safe or can never work (a read-only path that is `/`,
 * contains the server's workspaces, or lies where the sandbox puts its own directories).
 * The server refuses to start rather than run without isolation.
 */
export class SandboxConfigError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "SandboxConfigError";
  }
}

const _RUNTIME_RO = [
  "/usr",
  "/bin",
  "/sbin",
  "/lib",
  "/lib32",
  "/lib64",
  "/libx32",
  "/sys",
  "/opt/nvidia/nsight-compute",
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/alternatives",
  "/etc/localtime",
  "/etc/passwd",
  "/etc/group",
  "/etc/nsswitch.conf",
];
const _SANDBOX_RUNTIME = "/kcoral/runtime";
/** Where the GPU gate's shim is bound (read-only). */
const _SANDBOX_GATE = "/kcoral/gate";
const _GATE_ENV = "KCORAL_GATE_LIB";
/** Where the seat's workspaces are bound (the zygote hides them once it holds a handle). */
const _SANDBOX_WORKSPACES = "/kcoral/ws";
/**
 * Directories the sandbox builds itself: a host path bound at or below one of them would be
 * hidden by (or break) the sandbox's own mount or symlink; one above them would hide those.
 */
const _SANDBOX_OWNED = ["/work", "/kcoral", "/tmp", "/var/tmp", "/dev", "/proc"];
const _DEV_NODES = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full"];

/** Paths a worker of a slot launched with `launch` sees. */
export function workerPaths(
  launch: Pick<SlotLaunch, "sandbox" | "resultsDir" | "blobDir">,
): WorkerPaths {
  return launch.sandbox === "bubblewrap"
    ? { results: "/kcoral/results", blobDir: "/kcoral/blobs" }
    : { results: launch.resultsDir, blobDir: launch.blobDir };
}

/**
 * The command that starts a slot's zygote. Throws {@linkcode SandboxConfigError} for a refused
 * read-only path (see `_checkReadonlyPaths`).
 */
export function slotCommand(launch: SlotLaunch): SlotCommand {
  const zygote = [launch.python.executable, "-m", "kcoral_runtime.zygote", ...launch.zygoteArgs];
  const { [_GATE_ENV]: _inherited, ...env } = launch.env;
  if (launch.sandbox === "none") {
    return {
      command: zygote[0],
      args: zygote.slice(1),
      env: {
        ...env,
        ...(launch.gateLibrary ? { [_GATE_ENV]: launch.gateLibrary } : {}),
        PYTHONPATH: [launch.runtimePath, launch.env.PYTHONPATH].filter(Boolean).join(":"),
        PYTHONDONTWRITEBYTECODE: "1",
      },
      // Each request's workspace is put on sys.path by the worker itself (not this cwd).
      cwd: launch.workspacesDir,
      maxFrameBytes: launch.maxFrameBytes,
    };
  }
  const args = bwrapArgs(launch);
  const pythonPath = [
    _SANDBOX_RUNTIME,
    ..._checkReadonlyPaths(launch.readonlyPaths, launch.workspacesDir).filter(_isDir),
  ];
  return {
    command: "bwrap",
    args: [...args, "--", ...zygote, "--workspace", launch.workspace],
    env: { ...env, PYTHONPATH: pythonPath.join(":") },
    maxFrameBytes: launch.maxFrameBytes,
  };
}

/**
 * The bubblewrap arguments (everything before `--`) for a slot. Throws
 * {@linkcode SandboxConfigError} for a refused read-only path, and a plain `Error` when the
 * worker interpreter lies where the sandbox puts its own directories (it could not start).
 */
export function bwrapArgs(launch: SlotLaunch): string[] {
  const readonlyPaths = _checkReadonlyPaths(launch.readonlyPaths, launch.workspacesDir);
  const root = _realpath(launch.workspacesDir);
  const args = [
    "--unshare-all",
    "--unshare-user",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    // In the sandbox's user namespace only: the zygote binds each request's workspace at /work
    // (runtime_py/kcoral_runtime/workspace.py); children drop it before running any program.
    "--cap-add",
    "CAP_SYS_ADMIN",
    "--disable-userns",
  ];
  const bound = new Set<string>();
  const roBind = (path: string) => {
    if (bound.has(path) || !_exists(path)) return;
    bound.add(path);
    args.push("--ro-bind", _realpath(path), path);
  };
  for (const path of _RUNTIME_RO) roBind(path);
  const python = launch.python;
  const interpreterDirs = [python.prefix, python.basePrefix, _dirname(python.executable)];
  if (python.userSite) interpreterDirs.push(python.userSite);
  for (const path of interpreterDirs) {
    const owned = _ownedClash(path);
    if (owned !== null) {
      throw new Error(
        `the worker interpreter's ${path} lies at or under ${owned}, which the sandbox ` +
          `replaces; install Python elsewhere or use --sandbox none`,
      );
    }
    roBind(path);
  }
  for (const path of python.path) {
    // Module paths the sandbox cannot show at their place, or that would expose every
    // workspace, are left out (the sandbox's PYTHONPATH does not name them anyway).
    if (!path.startsWith("/") || _ownedClash(path) !== null) continue;
    if (_isAncestorOrSelf(_realpath(path), root) || _isAncestorOrSelf(path, root)) continue;
    roBind(path);
  }
  // Toolchains on the worker's PATH (e.g. a compiler under /opt/gcc that Triton or nvcc runs):
  // each directory, and for `<prefix>/bin` its whole prefix (libexec, lib, include). Not the
  // user's home, nothing the sandbox owns, nothing that contains the workspaces.
  const home = launch.env.HOME ? _realpath(launch.env.HOME) : null;
  for (const entry of (launch.env.PATH ?? "").split(":")) {
    if (!entry.startsWith("/")) continue;
    const candidates = [entry];
    if (/\/s?bin\/?$/.test(entry)) candidates.push(_dirname(entry.replace(/\/+$/, "")));
    for (const path of candidates) {
      if (path === "/" || !_isDir(path) || _ownedClash(path) !== null) continue;
      const real = _realpath(path);
      if (_isAncestorOrSelf(real, root) || _isAncestorOrSelf(path, root)) continue;
      if (home && (_isAncestorOrSelf(home, real) || _isAncestorOrSelf(real, home))) continue;
      if ([...bound].some((b) => _isAncestorOrSelf(b, path))) continue;
      roBind(path);
    }
  }
  for (const path of readonlyPaths) roBind(path);
  args.push("--bind", launch.workspacesDir, _SANDBOX_WORKSPACES, "--dir", "/work");
  args.push("--bind", launch.resultsDir, "/kcoral/results");
  args.push("--ro-bind", launch.blobDir, "/kcoral/blobs");
  args.push("--ro-bind", launch.runtimePath, _SANDBOX_RUNTIME);
  if (launch.gateLibrary) {
    args.push("--ro-bind", _dirname(launch.gateLibrary), _SANDBOX_GATE);
    args.push("--setenv", _GATE_ENV, `${_SANDBOX_GATE}/${_basename(launch.gateLibrary)}`);
  }
  args.push("--proc", "/proc", "--dir", "/dev");
  for (const node of _DEV_NODES) if (_exists(node)) args.push("--dev-bind", node, node);
  if (launch.gpu) {
    for (const device of launch.devices) {
      if (device.minor !== null) _devBind(args, `/dev/nvidia${device.minor}`);
    }
    for (const node of ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]) {
      _devBind(args, node);
    }
    try {
      for (const entry of Deno.readDirSync("/dev/nvidia-caps")) {
        if (entry.name.startsWith("nvidia-cap")) _devBind(args, `/dev/nvidia-caps/${entry.name}`);
      }
    } catch {
      // no capability nodes
    }
  }
  args.push(
    "--symlink",
    "/work/.kcoral/tmp",
    "/tmp",
    "--symlink",
    "/work/.kcoral/tmp",
    "/var/tmp",
    "--symlink",
    "/work/.kcoral/shm",
    "/dev/shm",
    "--symlink",
    "/proc/self/fd",
    "/dev/fd",
    "--symlink",
    "/proc/self/fd/0",
    "/dev/stdin",
    "--symlink",
    "/proc/self/fd/1",
    "/dev/stdout",
    "--symlink",
    "/proc/self/fd/2",
    "/dev/stderr",
  );
  const setenv: [string, string][] = [
    ["HOME", "/work/.kcoral/home"],
    ["TMPDIR", "/work/.kcoral/tmp"],
    ["TMP", "/work/.kcoral/tmp"],
    ["TEMP", "/work/.kcoral/tmp"],
    ["XDG_CACHE_HOME", "/work/.kcoral/cache"],
    ["CUDA_CACHE_PATH", "/work/.kcoral/cuda"],
    ["TRITON_CACHE_DIR", "/work/.kcoral/triton"],
    ["TORCH_EXTENSIONS_DIR", "/work/.kcoral/extensions"],
    ["TVM_FFI_CACHE_DIR", "/work/.kcoral/cache/tvm-ffi"],
    ["PYTHONDONTWRITEBYTECODE", "1"],
    ["KCORAL_SANDBOX", "bubblewrap"],
  ];
  // HOME moves into the workspace, so the interpreter would lose its user site (where a
  // non-root `pip install` puts numpy and torch): name its user base explicitly, read-only.
  if (python.userSite && python.userBase) setenv.push(["PYTHONUSERBASE", python.userBase]);
  else setenv.push(["PYTHONNOUSERSITE", "1"]);
  for (const [name, value] of setenv) args.push("--setenv", name, value);
  if (!launch.gpu) args.push("--remount-ro", "/proc");
  args.push("--chdir", "/work", "--remount-ro", "/");
  return args;
}

/**
 * Checks the read-only paths and returns them as absolute paths (relative ones are taken from
 * the server's working directory). Throws {@linkcode SandboxConfigError} for `/` or an ancestor
 * of the sandbox root (that would expose every workspace), and for a path at, inside or above
 * a directory the sandbox builds itself (`/work`, `/kcoral`, `/tmp`, `/var/tmp`, `/dev`,
 * `/proc`): the sandbox would hide it or could not start. Existence is not checked here.
 */
function _checkReadonlyPaths(paths: readonly string[], sandboxRoot: string): string[] {
  const root = _realpath(sandboxRoot);
  return paths.map((path) => {
    const absolute = resolve(path);
    const real = _realpath(absolute);
    if (
      real === "/" || absolute === "/" || _isAncestorOrSelf(real, root) ||
      _isAncestorOrSelf(absolute, root)
    ) {
      throw new SandboxConfigError(`read-only runtime path contains sandbox workspaces: ${path}`);
    }
    const owned = _ownedClash(absolute);
    if (owned !== null) {
      throw new SandboxConfigError(
        `--sandbox-readonly-path ${path} lies at, inside or above ${owned}, which the sandbox ` +
          `builds itself; use a path outside ${_SANDBOX_OWNED.join(", ")}`,
      );
    }
    return absolute;
  });
}

/**
 * Runs the probe of spec server §7.3 in a throwaway sandbox shaped like a slot's: must print
 * `kcoral-sandbox-ready` within `timeoutMs`. Resolves with `null` on success or the reason
 * (the server then runs without isolation). A refused read-only path is not a probe failure:
 * it throws {@linkcode SandboxConfigError} so the server refuses to start.
 */
export async function probeSandbox(launch: SlotLaunch, timeoutMs = 10_000): Promise<string | null> {
  _checkReadonlyPaths(launch.readonlyPaths, launch.workspacesDir);
  if (Deno.build.os !== "linux") return "bubblewrap isolation requires Linux";
  const missing = launch.readonlyPaths.find((path) => !_exists(path));
  if (missing !== undefined) return `--sandbox-readonly-path does not exist: ${missing}`;
  let args: string[];
  try {
    args = bwrapArgs(launch);
  } catch (error) {
    if (error instanceof SandboxConfigError) throw error;
    return errorMessage(error);
  }
  // As the zygote will (workspace.py): a mount namespace of its own, the workspace bound at /work.
  const code = "import ctypes,os\n" +
    "assert os.getcwd()=='/work', os.getcwd()\n" +
    "c=ctypes.CDLL(None,use_errno=True)\n" +
    "def ok(r,what):\n" +
    " assert r==0, what+': '+os.strerror(ctypes.get_errno())\n" +
    "ok(c.unshare(0x20000),'unshare(CLONE_NEWNS)')\n" +
    "ok(c.mount(None,b'/',None,16384|(1<<18),None),'mount --make-rprivate /')\n" +
    `ok(c.mount(b'${_SANDBOX_WORKSPACES}/${launch.workspace}',b'/work',None,4096,None),` +
    "'bind the workspace at /work')\n" +
    "os.chdir('/work');os.makedirs('.kcoral/probe', exist_ok=True)\n" +
    "print('kcoral-sandbox-ready')";
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command("bwrap", {
      args: [...args, "--", launch.python.executable, "-I", "-S", "-c", code],
      env: launch.env,
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      detached: true,
    }).spawn();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      return "bubblewrap isolation requires bwrap on PATH; install bubblewrap";
    }
    return `cannot start bwrap: ${errorMessage(error)}`;
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), timeoutMs);
  });
  const result = await Promise.race([child.output(), timedOut]);
  clearTimeout(timer);
  if (result === "timeout") {
    try {
      Deno.kill(-child.pid, "SIGKILL");
    } catch {
      // gone
    }
    await child.status;
    return `the bubblewrap probe did not finish within ${timeoutMs / 1000} s`;
  }
  const stdout = new TextDecoder().decode(result.stdout);
  if (result.success && stdout.includes("kcoral-sandbox-ready")) return null;
  const stderr = new TextDecoder().decode(result.stderr).trim().slice(-2000);
  return `the bubblewrap probe failed (exit ${result.code}): ${stderr || stdout.trim()}`;
}

/** The sandbox-owned directory `path` is at, inside or above, or `null`. */
function _ownedClash(path: string): string | null {
  for (const owned of _SANDBOX_OWNED) {
    if (_isAncestorOrSelf(owned, path) || _isAncestorOrSelf(path, owned)) return owned;
  }
  return null;
}

/** Whether `ancestor` is `path` or one of its parent directories (normalized, absolute). */
function _isAncestorOrSelf(ancestor: string, path: string): boolean {
  if (ancestor === "/") return true;
  const a = ancestor.replace(/\/+$/, "");
  return path === a || path.startsWith(a + "/");
}

function _devBind(args: string[], node: string): void {
  if (_exists(node)) args.push("--dev-bind", node, node);
}

function _isDir(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch {
    return false;
  }
}

function _exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

function _realpath(path: string): string {
  try {
    return Deno.realPathSync(path);
  } catch {
    return path;
  }
}

function _dirname(path: string): string {
  const i = path.lastIndexOf("/");
  return i <= 0 ? "/" : path.slice(0, i);
}

function _basename(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}
