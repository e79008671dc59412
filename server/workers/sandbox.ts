/**
 * Worker isolation with bubblewrap: the command line that starts a slot's zygote in its sandbox
 * (or directly, without isolation), the paths a worker sees, and the startup probe. Inside, a slot
 * sees the runtime read-only, the current request's workspace at `/work`, its results directory,
 * the blobs read-only, only its own GPU device nodes, and no network; the zygote alone keeps
 * `CAP_SYS_ADMIN` (in the sandbox's user namespace) to switch `/work`.
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
  /** GPU workers get their device nodes and a writable `/proc` (NVIDIA init needs it). */
  gpu: boolean;
  /** Base environment (the server's own, minus what must not leak). */
  env: Record<string, string>;
  /** Largest frame taken from the zygote (answers up to the response limit must fit). */
  maxFrameBytes?: number;
  /** The GPU gate's shim on the host (`KCORAL_GATE_LIB`; bound at `/kcoral/gate`); `null`: none. */
  gateLibrary?: string | null;
}

/** Paths as a worker inside the slot sees them (its workspace: `SeatWorkspaces.workerPath`). */
export interface WorkerPaths {
  /** Where the child writes result parts and capture files. */
  results: string;
  /** Where input blobs are. */
  blobDir: string;
}

/** A read-only path that can never be safe or work: the server refuses to start. */
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
const _SANDBOX_GATE = "/kcoral/gate";
const _GATE_ENV = "KCORAL_GATE_LIB";
const _SANDBOX_WORKSPACES = "/kcoral/ws";
/** Directories the sandbox builds itself: no host path may be bound at, below or above them. */
const _SANDBOX_OWNED = ["/work", "/kcoral", "/tmp", "/var/tmp", "/dev", "/proc"];
const _DEV_NODES = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full"];
const _SYMLINKS = [
  ["/work/.kcoral/tmp", "/tmp"],
  ["/work/.kcoral/tmp", "/var/tmp"],
  ["/work/.kcoral/shm", "/dev/shm"],
  ["/proc/self/fd", "/dev/fd"],
  ["/proc/self/fd/0", "/dev/stdin"],
  ["/proc/self/fd/1", "/dev/stdout"],
  ["/proc/self/fd/2", "/dev/stderr"],
];

/** Paths a worker of a slot launched with `launch` sees. */
export function workerPaths(
  launch: Pick<SlotLaunch, "sandbox" | "resultsDir" | "blobDir">,
): WorkerPaths {
  return launch.sandbox === "bubblewrap"
    ? { results: "/kcoral/results", blobDir: "/kcoral/blobs" }
    : { results: launch.resultsDir, blobDir: launch.blobDir };
}

/** The command that starts a slot's zygote; throws {@linkcode SandboxConfigError}. */
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

/** The bubblewrap arguments (everything before `--`) for a slot. */
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
    // The zygote binds each request's workspace at /work; children drop it before any program.
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
    // Left out: paths the sandbox cannot show in place, or that would expose every workspace.
    if (!path.startsWith("/") || _ownedClash(path) !== null) continue;
    if (_isAncestorOrSelf(_realpath(path), root) || _isAncestorOrSelf(path, root)) continue;
    roBind(path);
  }
  // Toolchains on the worker's PATH (and a `<prefix>/bin`'s prefix); not home, owned dirs or
  // anything containing the workspaces.
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
  for (const node of _DEV_NODES) _devBind(args, node);
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
  for (const [target, link] of _SYMLINKS) args.push("--symlink", target, link);
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
  // HOME moves into the workspace: keep a non-root `pip install`'s user site, read-only.
  if (python.userSite && python.userBase) setenv.push(["PYTHONUSERBASE", python.userBase]);
  else setenv.push(["PYTHONNOUSERSITE", "1"]);
  for (const [name, value] of setenv) args.push("--setenv", name, value);
  if (!launch.gpu) args.push("--remount-ro", "/proc");
  args.push("--chdir", "/work", "--remount-ro", "/");
  return args;
}

/**
 * The read-only paths made absolute. Throws {@linkcode SandboxConfigError} for `/`, an ancestor
 * of the workspaces, or a path clashing with a directory the sandbox builds itself.
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
 * Runs the startup probe in a throwaway sandbox shaped like a slot's: `null` on success, else the
 * reason (the server runs without isolation). A refused read-only path throws instead.
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
  // As the zygote will: its own mount namespace, the workspace bound at /work.
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
