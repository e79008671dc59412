/**
 * Worker isolation with bubblewrap (issue 5, spec server §7): every case is a program sent to a
 * sandboxed server over real HTTP; the attempt must fail observably and the server must keep
 * serving. A server whose bubblewrap probe fails makes these tests fail loudly (never a silent
 * pass without isolation): CI installs `bubblewrap` (scripts/setup.sh).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { type AppOptions, createApp } from "../server/app.ts";
import { ConfigError, type ServerConfig } from "../server/config.ts";
import { pythonInfo } from "../server/workers/python_info.ts";
import { SandboxConfigError } from "../server/workers/sandbox.ts";
import {
  callProgram,
  OUTLIVE_ANSWER,
  postProgram,
  startServer,
  type TestServer,
} from "./_server.ts";

type Json = Record<string, unknown>;

const HOME = Deno.env.get("HOME") ?? "";
const LEFTOVER = "program left background processes running; they were terminated";
/**
 * A program that outlives its answer by 3 s (it stalls the flush of the streams at its process's
 * exit) and meanwhile writes `marker` (8 bytes) over the environment block of every other child
 * of its zygote with `process_vm_writev`, again and again.
 */
const INJECTOR = `${OUTLIVE_ANSWER}
import ctypes, os

class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def _write_into_siblings(marker):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                       ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    data = ctypes.create_string_buffer(marker.encode(), 8)
    me, zygote = os.getpid(), os.getppid()
    while time.time() < _outlive["deadline"]:
        kids = set()
        try:
            for tid in os.listdir(f"/proc/{zygote}/task"):
                with open(f"/proc/{zygote}/task/{tid}/children") as children:
                    kids |= {int(p) for p in children.read().split()}
        except OSError:
            pass
        for pid in kids - {me}:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    env_start = int(stat.read().rsplit(")", 1)[1].split()[47])
            except (OSError, ValueError, IndexError):
                continue
            local = _Iovec(ctypes.cast(data, ctypes.c_void_p), 8)
            remote = _Iovec(env_start, 8)
            if env_start:
                libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        time.sleep(0.002)

def f(marker):
    outlive_answer(3.0)
    threading.Thread(target=_write_into_siblings, args=(marker,), daemon=True).start()
    return 1
`;
/** Variables the sandbox points inside `/work/.kcoral`. */
const KCORAL_DIRS = [
  "HOME",
  "TMPDIR",
  "XDG_CACHE_HOME",
  "CUDA_CACHE_PATH",
  "TRITON_CACHE_DIR",
  "TORCH_EXTENSIONS_DIR",
];

/** Starts a server that must really be sandboxed; fails with the probe's reason otherwise. */
async function sandboxed(
  config: Partial<ServerConfig>,
  options: AppOptions = {},
): Promise<TestServer> {
  const server = await startServer({ ...config, sandbox: "bubblewrap" }, options);
  if (server.app.sandbox !== "bubblewrap") {
    const reason = server.events.find((e) => e.event === "sandbox_disabled")?.error;
    await server.stop();
    throw new Error(
      `bubblewrap isolation did not start on this machine, so the sandbox is untested: ${reason}` +
        " (install bubblewrap and allow unprivileged user namespaces)",
    );
  }
  return server;
}

/** Runs `name(*args)` from `source`; asserts HTTP 200 and returns the body. */
async function run(
  server: TestServer,
  source: string,
  name = "f",
  args: unknown[] = [],
  headers: Record<string, string> = {},
): Promise<Json> {
  const { status, json } = await postProgram(server.url, callProgram(source, name, args), {
    headers,
  });
  assert.equal(status, 200, JSON.stringify(json));
  return json;
}

/** The `out` value of a COMPLETED response. */
function out<T = unknown>(json: Json): T {
  assert.equal(json.status, "COMPLETED", JSON.stringify(json.error));
  return (json.results as { out: { value: T } }).out.value;
}

/** The response of a program whose `f` returns `json.dumps(...)`, parsed. */
async function probe<T = Json>(
  server: TestServer,
  source: string,
  args: unknown[] = [],
): Promise<T> {
  return JSON.parse(out<string>(await run(server, `import json, os\n${source}`, "f", args)));
}

/** The server still answers /health and runs a trivial program. */
async function assertServing(server: TestServer): Promise<void> {
  const health = await fetch(`${server.url}/health`);
  assert.equal(health.status, 200);
  assert.equal((await health.json()).status, "ok");
  assert.equal(out(await run(server, "def f():\n    return 6 * 7\n")), 42);
}

/** The seat (`cpu/w0`, ...) that served a request. */
function seatOf(server: TestServer, requestId: unknown): string {
  const routed = server.events.find((e) =>
    e.event === "request_routed" && e.request_id === requestId
  );
  assert.ok(routed, `no request_routed event for ${requestId}`);
  return String(routed.worker_id);
}

/** Whether `relative` exists in any workspace (current or not yet removed) of any seat. */
async function inAnyWorkspace(server: TestServer, relative: string): Promise<boolean> {
  for (const seat of server.pool.seats) {
    for (const entry of [...Deno.readDirSync(seat.workspaces.root)]) {
      if (await exists(`${seat.workspaces.root}/${entry.name}/${relative}`)) return true;
    }
  }
  return false;
}

/**
 * Runs `source` on `seat`: once every seat is idle, one request per seat is sent at once, so
 * each seat takes exactly one whatever the pool's choice policy; returns the one `seat` ran.
 */
async function runOnSeat(server: TestServer, seat: string, source: string): Promise<Json> {
  await server.pool.settled();
  const all = await Promise.all(server.pool.seats.map(() => run(server, source)));
  const mine = all.find((json) => seatOf(server, json.request_id) === seat);
  assert.ok(mine, `no request reached ${seat}: ${all.map((j) => seatOf(server, j.request_id))}`);
  return mine;
}

/** Host pids whose command line contains `marker`. */
function processesWith(marker: string): number[] {
  const found: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      if (Deno.readTextFileSync(`/proc/${entry.name}/cmdline`).includes(marker)) {
        found.push(Number(entry.name));
      }
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * A scratch directory on the host outside every directory the sandbox builds itself, under the
 * server user's real $HOME (which the sandbox must hide, apart from the interpreter's files).
 */
async function hostScratch(): Promise<string> {
  const clash = ["/work", "/kcoral", "/tmp", "/var/tmp", "/dev", "/proc"].find((d) =>
    HOME === d || HOME.startsWith(d + "/")
  );
  if (!HOME.startsWith("/") || HOME === "/" || clash) {
    throw new Error(`these tests need $HOME outside the sandbox's own directories, not ${HOME}`);
  }
  return await Deno.makeTempDir({ dir: HOME, prefix: ".kcoral-sandbox-test-" });
}

/** Tries writes and reads inside the sandbox; each entry is "ok" or `Errno:<name>`. */
const ATTEMPTS = `
import errno
def attempt(action, path):
    try:
        if action == 'write':
            with open(path, 'a') as fh:
                fh.write('kcoral sandbox test\\n')
            return 'ok'
        if action == 'read':
            with open(path, 'rb') as fh:
                return 'read:' + fh.read().decode('utf-8', 'replace')
        if action == 'mkdir':
            os.mkdir(path)
            return 'ok'
        if action == 'exists':
            return 'visible' if os.path.lexists(path) else 'absent'
    except OSError as exc:
        return 'Errno:' + errno.errorcode.get(exc.errno, str(exc.errno))
def f(items):
    return json.dumps([attempt(action, path) for action, path in items])
`;

Deno.test("sandbox (cpu, fresh workers): escapes fail and the server keeps serving", async (t) => {
  const scratch = await hostScratch();
  const tmpSecret = await Deno.makeTempFile({ prefix: "kcoral-sandbox-secret-" });
  const cleanup: string[] = [tmpSecret];
  const server = await sandboxed({ numWorkers: 2, logDir: `${scratch}/logs`, logPrograms: true });
  const tag = crypto.randomUUID();
  try {
    await t.step("writes to /usr, /etc and the server user's $HOME fail", async () => {
      const targets = [
        `/usr/kcoral-${tag}`,
        `/usr/lib/kcoral-${tag}`,
        `/etc/kcoral-${tag}`,
        `${HOME}/kcoral-${tag}`,
      ];
      const items = targets.map((p) => ["write", p]).concat([["write", "/etc/passwd"]]);
      const results = await probe<string[]>(server, ATTEMPTS, [items]);
      for (const [i, result] of results.slice(0, targets.length).entries()) {
        // Read-only file system, or a directory that does not exist in the sandbox at all.
        assert.match(result, /^Errno:(EROFS|ENOENT)$/, `${items[i][1]}: ${result}`);
      }
      // /etc/passwd exists: as root only the read-only mount stops the write; others also
      // lack the permission, which the kernel checks first.
      assert.match(results[4], Deno.uid() === 0 ? /^Errno:EROFS$/ : /^Errno:(EROFS|EACCES)$/);
      for (const target of targets) assert.equal(await exists(target), false, target);
      await assertServing(server);
    });

    await t.step("another slot's workspace and results are not even visible", async () => {
      const hostDirs = server.pool.seats.flatMap((s) => [s.workspaces.root, s.resultsDir]);
      const runtimeDir = hostDirs[0].slice(0, hostDirs[0].indexOf("/slots/"));
      const items = [
        ...hostDirs.map((d) => ["exists", d]),
        ["exists", runtimeDir],
        ...hostDirs.map((d) => ["write", `${d}/planted-${tag}`]),
        ["write", `/work/mine-${tag}`],
      ];
      const json = await run(server, `import json, os\n${ATTEMPTS}`, "f", [items]);
      const results: string[] = JSON.parse(out(json));
      const own = seatOf(server, json.request_id);
      for (const [i, result] of results.slice(0, hostDirs.length + 1).entries()) {
        assert.equal(result, "absent", `${items[i][1]} must not be visible`);
      }
      for (const result of results.slice(hostDirs.length + 1, -1)) {
        assert.equal(result, "Errno:ENOENT");
      }
      assert.equal(results.at(-1), "ok");
      for (const seat of server.pool.seats) {
        for (const dir of [seat.workspaces.root, seat.resultsDir]) {
          assert.equal(await exists(`${dir}/planted-${tag}`), false, dir);
        }
      }
      // Request files are removed when the request ends.
      assert.equal(await inAnyWorkspace(server, `mine-${tag}`), false);
      assert.ok(own);
      await assertServing(server);
    });

    await t.step("files the server and the test wrote outside /work cannot be read", async () => {
      const runDir = String(server.events.find((e) => e.event === "server_started")!.run_dir);
      const secret = `secret-${tag}`;
      await Deno.writeTextFile(tmpSecret, secret);
      const homeSecret = `${scratch}/secret.txt`;
      await Deno.writeTextFile(homeSecret, secret);
      const requestId = crypto.randomUUID();
      const record = `${runDir}/programs/${requestId}.json`;
      const items = [tmpSecret, homeSecret, record, `${runDir}/events.jsonl`].map((p) => [
        "read",
        p,
      ]);
      const json = await run(server, `import json, os\n${ATTEMPTS}`, "f", [items], {
        "x-request-id": requestId,
      });
      assert.equal(json.request_id, requestId);
      const results: string[] = JSON.parse(out(json));
      assert.ok(await exists(record), "the server recorded the program on the host");
      for (const [i, result] of results.entries()) {
        assert.equal(result, "Errno:ENOENT", `${items[i][1]}: ${result}`);
      }
      assert.equal(JSON.stringify(json).includes(secret), false);
    });

    await t.step(
      "a capture file swapped for a symlink does not leak a host file through the server",
      async () => {
        // The server reads capture files on the host: a symlink planted in /kcoral/results must
        // not make it read a host file the sandbox hides. The program gives the link a stand-in
        // target inside its own /tmp so that the worker reports a non-empty capture file.
        const secret = `symlinked-secret-${tag}`;
        const target = await Deno.makeTempFile({ dir: "/tmp", prefix: "kcoral-sandbox-link-" });
        cleanup.push(target);
        await Deno.writeTextFile(target, secret + "\n");
        const source = "import os\n" +
          "def f(target):\n" +
          "    print('x' * 200, flush=True)\n" +
          "    with open(target, 'w') as fh:\n" +
          "        fh.write('y' * 200)\n" +
          "    for name in ('stdout', 'stderr'):\n" +
          "        os.unlink('/kcoral/results/' + name)\n" +
          "        os.symlink(target, '/kcoral/results/' + name)\n" +
          "    return 1\n";
        const { status, json } = await postProgram(
          server.url,
          callProgram(source, "f", [target]),
        );
        assert.equal(JSON.stringify(json).includes(secret), false, "host file leaked");
        assert.ok(status === 200 || status === 500, String(status));
        await assertServing(server);
      },
    );

    await t.step("only runtime paths and the slot's own directories are mounted", async () => {
      const python = await pythonInfo(server.config.python);
      const allowed = [
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
        python.prefix,
        python.basePrefix,
        python.executable.slice(0, python.executable.lastIndexOf("/")),
        ...python.path,
        "/work",
        // The seat's workspaces, and the empty file system the zygote hides them under.
        "/kcoral/ws",
        "/kcoral/results",
        "/kcoral/blobs",
        "/kcoral/runtime",
        "/proc",
        "/dev/null",
        "/dev/zero",
        "/dev/random",
        "/dev/urandom",
        "/dev/full",
        // Toolchains on the worker's PATH (and the prefix of each `<prefix>/bin`), outside
        // the home directory: see bwrapArgs.
        ...(Deno.env.get("PATH") ?? "").split(":").filter((p) => p.startsWith("/")).flatMap((p) =>
          /\/s?bin\/?$/.test(p) ? [p, p.replace(/\/+$/, "").replace(/\/[^/]+$/, "")] : [p]
        ).filter((p) => p !== "" && p !== "/"),
      ];
      const seen = await probe<{ mounts: string[]; pids: Record<string, string> }>(
        server,
        "def f():\n" +
          "    mounts = [l.split()[4].encode().decode('unicode_escape')\n" +
          "              for l in open('/proc/self/mountinfo')]\n" +
          "    pids = {}\n" +
          "    for pid in filter(str.isdigit, os.listdir('/proc')):\n" +
          "        try:\n" +
          "            pids[pid] = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode()\n" +
          "        except OSError:\n" +
          "            pass\n" +
          "    return json.dumps({'mounts': mounts, 'pids': pids})\n",
      );
      const unexpected = seen.mounts.filter((mount) =>
        mount !== "/" && !allowed.some((root) => mount === root || mount.startsWith(root + "/"))
      );
      assert.deepEqual(unexpected, [], `unexpected mounts in the sandbox: ${seen.mounts}`);
      for (const mount of ["/work", "/kcoral/results", "/kcoral/blobs", "/kcoral/runtime"]) {
        assert.ok(seen.mounts.includes(mount), mount);
      }
      // Its own PID namespace: bwrap is pid 1 and no host process (this server) is visible.
      assert.match(seen.pids["1"], /bwrap$/);
      assert.ok(Object.keys(seen.pids).length <= 6, JSON.stringify(seen.pids));
      assert.equal(Object.values(seen.pids).some((cmd) => cmd.includes("deno")), false);
    });

    await t.step("no network: a TCP listener on 127.0.0.1 accepts nothing", async () => {
      const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      let accepted = 0;
      const accepting = (async () => {
        try {
          for await (const conn of listener) {
            accepted++;
            conn.close();
          }
        } catch {
          // closed
        }
      })();
      try {
        const result = await probe<{ connect: string; interfaces: string[] }>(
          server,
          "import socket\n" +
            "def f(port):\n" +
            "    try:\n" +
            "        socket.create_connection(('127.0.0.1', port), timeout=3).close()\n" +
            "        connect = 'connected'\n" +
            "    except OSError as exc:\n" +
            "        connect = type(exc).__name__\n" +
            "    names = [name for _, name in socket.if_nameindex()]\n" +
            "    return json.dumps({'connect': connect, 'interfaces': names})\n",
          [(listener.addr as Deno.NetAddr).port],
        );
        assert.notEqual(result.connect, "connected");
        assert.deepEqual(result.interfaces, ["lo"], "only the namespace's own loopback");
        await new Promise((resolve) => setTimeout(resolve, 200));
        assert.equal(accepted, 0, "the host listener must see no connection");
      } finally {
        listener.close();
        await accepting;
      }
    });

    await t.step("a background process is killed and the next request is clean", async () => {
      const marker = `kcoral-sandbox-bg-${tag}`;
      const source = "import subprocess, sys\n" +
        "def f(marker):\n" +
        "    code = 'import os, time\\nif os.fork() == 0:\\n    time.sleep(300)\\ntime.sleep(300)'\n" +
        "    subprocess.Popen([sys.executable, '-c', code, marker], start_new_session=True)\n" +
        "    return 1\n";
      const json = await run(server, source, "f", [marker]);
      assert.equal(json.status, "FAILED");
      assert.deepEqual(
        [(json.error as Json).kind, (json.error as Json).message],
        ["runtime", LEFTOVER],
      );
      assert.deepEqual(processesWith(marker), [], "no process of the program may survive");
      const seen = await probe<string[]>(
        server,
        "def f(marker):\n" +
          "    seen = []\n" +
          "    for pid in filter(str.isdigit, os.listdir('/proc')):\n" +
          "        try:\n" +
          "            seen.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode())\n" +
          "        except OSError:\n" +
          "            pass\n" +
          "    return json.dumps([c for c in seen if marker in c])\n",
        [marker],
      );
      assert.deepEqual(seen, []);
      assert.deepEqual(processesWith(marker), []);
    });

    await t.step("a program cannot ptrace the zygote that forks every later worker", async () => {
      const [result, errno] = await probe<[number, number]>(
        server,
        "import ctypes\n" +
          "def f():\n" +
          "    libc = ctypes.CDLL(None, use_errno=True)\n" +
          "    zygote = os.getppid()\n" +
          "    seize = libc.ptrace(ctypes.c_long(0x4206), ctypes.c_long(zygote), None, None)\n" +
          "    errno = ctypes.get_errno()\n" +
          "    if seize == 0:  # (the fix is missing) let go; our exit would detach too\n" +
          "        libc.ptrace(ctypes.c_long(0x11), ctypes.c_long(zygote), None, None)\n" +
          "    return json.dumps([seize, errno])\n",
      );
      assert.deepEqual([result, errno], [-1, 1]); // EPERM
      await assertServing(server);
    });

    await t.step(
      "a program outliving its answer cannot write into the seat's next worker",
      async () => {
        // The program keeps its process alive for 3 s after the answer (it stalls the flush of the
        // streams at exit) while a thread writes a marker over the environment block of every
        // other child of the zygote: the next worker is forked as the old one exits.
        const marker = "KCINJECT";
        const json = await run(server, INJECTOR, "f", [marker]);
        assert.equal(json.status, "COMPLETED", JSON.stringify(json.error));
        const seat = seatOf(server, json.request_id);
        const victim = await runOnSeat(
          server,
          seat,
          "def f():\n    return open('/proc/self/environ', 'rb').read().find(b'" + marker + "')\n",
        );
        assert.equal(out(victim), -1, "the next worker's memory was written by the last program");
        // The attacker's worker's exit: the first on its seat after its request was routed.
        const routedAt = server.events.findIndex((e) =>
          e.event === "request_routed" && e.request_id === json.request_id
        );
        const exited = server.events.slice(routedAt).find((e) =>
          e.event === "worker_exited" && e.worker_id === seat
        );
        assert.ok(
          Number(exited?.teardown_ms) > 1000,
          `the program must outlive its answer for the test to mean anything: ${
            JSON.stringify(exited)
          }`,
        );
        await assertServing(server);
      },
    );

    await t.step("an upload into .kcoral/ fails: cannot materialize file", async () => {
      const bytes = new TextEncoder().encode(`planted ${tag}`);
      const sha = createHash("sha256").update(bytes).digest("hex");
      for (const path of [".kcoral/home/.bashrc", ".kcoral", ".kcoral/x"]) {
        const { status, json } = await postProgram(server.url, {
          instructions: [{ op: "upload", id: "u", kind: "file", blob: sha, path }],
        }, { blobs: { [sha]: bytes } });
        assert.equal(status, 200, JSON.stringify(json));
        assert.equal(json.status, "FAILED", path);
        const error = json.error as Json;
        assert.equal(error.kind, "runtime");
        assert.match(String(error.message), new RegExp(`^cannot materialize file '${path}'`));
        assert.equal(error.instruction_op, "upload");
      }
      assert.equal(await inAnyWorkspace(server, ".kcoral/home/.bashrc"), false);
      await assertServing(server);
    });

    await t.step("the blob directory, the runtime and /proc are read-only", async () => {
      const bytes = new TextEncoder().encode(`blob ${tag}`);
      const sha = createHash("sha256").update(bytes).digest("hex");
      const source = "import json, os\n" +
        "def f(data, sha):\n" +
        "    out = {'listed': sha in os.listdir('/kcoral/blobs'), 'data': data.decode()}\n" +
        "    for name, act in [('blob', lambda: open('/kcoral/blobs/' + sha, 'r+b')),\n" +
        "                      ('remove', lambda: os.remove('/kcoral/blobs/' + sha)),\n" +
        "                      ('new', lambda: open('/kcoral/blobs/new', 'wb')),\n" +
        "                      ('runtime', lambda: open('/kcoral/runtime/x.py', 'w')),\n" +
        "                      ('comm', lambda: open('/proc/self/comm', 'w').write('x'))]:\n" +
        "        try:\n" +
        "            act()\n" +
        "            out[name] = 'ok'\n" +
        "        except OSError as exc:\n" +
        "            out[name] = exc.errno\n" +
        "    return json.dumps(out)\n";
      const { status, json } = await postProgram(server.url, {
        instructions: [
          { op: "upload", id: "b", kind: "bytes", blob: sha },
          { op: "upload", id: "m", kind: "module", source },
          { op: "get_function", id: "fn", module: { $ref: "m" }, name: "f" },
          { op: "run", id: "r", fn: { $ref: "fn" }, args: [{ $ref: "b" }, sha] },
          { op: "return", key: "out", value: { $ref: "r" } },
        ],
      }, { blobs: { [sha]: bytes } });
      assert.equal(status, 200);
      const result = JSON.parse(out<string>(json));
      const EROFS = 30;
      assert.deepEqual(result, {
        listed: true,
        data: `blob ${tag}`,
        blob: EROFS,
        remove: EROFS,
        new: EROFS,
        runtime: EROFS,
        comm: EROFS,
      });
    });

    await t.step("/tmp, /var/tmp and /dev/shm live in the slot's own workspace", async () => {
      const json = await run(
        server,
        "import json, os\n" +
          "def f(tag):\n" +
          "    for d in ('/tmp', '/var/tmp', '/dev/shm'):\n" +
          "        open(f'{d}/{tag}', 'w').write(d)\n" +
          "    seen = [os.path.exists(f'/work/.kcoral/{s}/{tag}') for s in ('tmp', 'shm')]\n" +
          "    real = ','.join(os.path.realpath(d) for d in ('/tmp', '/var/tmp', '/dev/shm'))\n" +
          "    return json.dumps([real, seen])\n",
        "f",
        [`in-slot-${tag}`],
      );
      const [real, seen] = JSON.parse(out<string>(json)) as [string, boolean[]];
      assert.equal(real, "/work/.kcoral/tmp,/work/.kcoral/tmp,/work/.kcoral/shm");
      assert.deepEqual(seen, [true, true]);
      assert.equal(await inAnyWorkspace(server, `.kcoral/tmp/in-slot-${tag}`), false, "removed");
      for (const dir of ["/tmp", "/var/tmp", "/dev/shm"]) {
        assert.equal(await exists(`${dir}/in-slot-${tag}`), false, `host ${dir}`);
      }
    });

    await t.step("directories a program made read-only do not break the next request", async () => {
      const lock = "import os\n" +
        "def f():\n" +
        "    for d in ('/kcoral/results', '/work/.kcoral', '/tmp', '/dev/shm', os.environ['HOME']):\n" +
        "        os.chmod(d, 0o500)\n" +
        "    os.chmod(os.environ['XDG_CACHE_HOME'], 0)\n" +
        "    os.chmod('/work', 0o500)\n" +
        "    return 1\n";
      const locked = await run(server, lock);
      assert.equal(out(locked), 1);
      const use = "import os, tempfile\n" +
        "def f():\n" +
        "    print('still works')\n" +
        "    for d in ('/work', '/tmp', '/dev/shm', os.environ['HOME'], os.environ['XDG_CACHE_HOME']):\n" +
        "        open(os.path.join(d, 'file'), 'w').write('x')\n" +
        "    tempfile.mkstemp()\n" +
        "    return 2\n";
      const json = await runOnSeat(server, seatOf(server, locked.request_id), use);
      assert.equal(out(json), 2);
      assert.equal(json.stdout, "still works\n");
    });

    await t.step("files written by one request are gone for the next (fresh)", async () => {
      await assertCleanNextRequest(server, tag);
    });

    await t.step("the server still serves", async () => {
      await assertServing(server);
      await server.pool.settled();
      assert.equal(server.app.health().load.request_capacity, server.pool.seats.length);
    });
  } finally {
    await server.stop();
    await Deno.remove(scratch, { recursive: true });
    for (const path of cleanup) await Deno.remove(path);
  }
});

/** Writes everywhere a program may write; the next request on that seat finds none of it. */
async function assertCleanNextRequest(server: TestServer, tag: string): Promise<void> {
  const places = ["/work/top", "/work/sub/dir/file", "/tmp/t", "/var/tmp/v", "/dev/shm/s"]
    .concat(KCORAL_DIRS.map((name) => `$${name}/x`));
  const write = "import os\n" +
    "def f(places, tag):\n" +
    "    for place in places:\n" +
    "        path = os.path.expandvars(place)\n" +
    "        os.makedirs(os.path.dirname(path), exist_ok=True)\n" +
    "        open(path, 'w').write(tag)\n" +
    "    os.chmod('/work/sub/dir', 0o500)\n" +
    "    os.chmod('/work/sub', 0o500)\n" +
    "    return os.getpid()\n";
  const first = await postProgram(server.url, callProgram(write, "f", [places, tag]));
  assert.equal(first.json.status, "COMPLETED", JSON.stringify(first.json.error));
  const seat = seatOf(server, first.json.request_id);
  const list = "import os, json\n" +
    "def f():\n" +
    "    found = []\n" +
    "    for root, dirs, files in os.walk('/work'):\n" +
    "        found += [os.path.join(root, n) for n in files]\n" +
    "        found += [os.path.join(root, d) + '/' for d in dirs]\n" +
    "    return json.dumps({'pid': os.getpid(), 'found': sorted(found)})\n";
  const second = JSON.parse(out<string>(await runOnSeat(server, seat, list)));
  const expected = ["cache", "cuda", "extensions", "home", "libraries", "shm", "tmp", "triton"]
    .map((d) => `/work/.kcoral/${d}/`).concat(["/work/.kcoral/"]).sort();
  assert.deepEqual(second.found, expected);
  const reused = server.config.maxRequestsPerWorker !== 1;
  assert.equal(second.pid === out(first.json), reused, "the same process served both iff reused");
}

Deno.test("sandbox (cpu, reused workers): cleanup, leftovers retire the worker", async (t) => {
  const server = await sandboxed({ numWorkers: 1, maxRequestsPerWorker: 0 });
  const tag = crypto.randomUUID();
  try {
    await t.step("HOME, TMPDIR and the cache variables point inside /work/.kcoral", async () => {
      const env = await probe<Record<string, unknown>>(
        server,
        "import tempfile\n" +
          "def f(names):\n" +
          "    out = {n: os.environ.get(n) for n in names}\n" +
          "    for n in names:\n" +
          "        open(os.path.join(os.environ[n], 'probe'), 'w').close()\n" +
          "    out['gettempdir'] = tempfile.gettempdir()\n" +
          "    out['home'] = os.path.expanduser('~')\n" +
          "    out['cwd'] = os.getcwd()\n" +
          "    return json.dumps(out)\n",
        [KCORAL_DIRS],
      );
      assert.deepEqual(env, {
        HOME: "/work/.kcoral/home",
        TMPDIR: "/work/.kcoral/tmp",
        XDG_CACHE_HOME: "/work/.kcoral/cache",
        CUDA_CACHE_PATH: "/work/.kcoral/cuda",
        TRITON_CACHE_DIR: "/work/.kcoral/triton",
        TORCH_EXTENSIONS_DIR: "/work/.kcoral/extensions",
        gettempdir: "/work/.kcoral/tmp",
        home: "/work/.kcoral/home",
        cwd: "/work",
      });
    });

    await t.step("files written by one request are gone for the next (reused)", async () => {
      await assertCleanNextRequest(server, tag);
    });

    await t.step("a module imported from /tmp is the workspace's: gone for the next", async () => {
      // /tmp leads into /work/.kcoral/tmp: each request writes its own kc_tmp_mod and imports
      // it from there; the same worker must import the second one, not keep the first.
      const source = (value: number) =>
        "import os, sys\n" +
        "def f():\n" +
        `    open('/tmp/kc_tmp_mod.py', 'w').write('VALUE = ${value}\\n')\n` +
        "    sys.path.insert(0, '/tmp')\n" +
        "    import kc_tmp_mod\n" +
        "    return [os.getpid(), kc_tmp_mod.VALUE]\n";
      const values = async (value: number) =>
        out<{ value: number }[]>(await run(server, source(value))).map((v) => v.value);
      const [pid, first] = await values(1);
      const [again, second] = await values(2);
      assert.deepEqual([again, first, second], [pid, 1, 2]);
    });

    const leftovers: [string, string, string][] = [
      [
        "a thread still running",
        "import threading, time\n" +
        "def f():\n" +
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n" +
        "    return os.getpid()\n",
        "sandbox_cleanup",
      ],
      [
        "a file kept open under /work",
        "import builtins\n" +
        "def f():\n" +
        "    builtins._kcoral_kept = open('/work/kept.txt', 'w')\n" +
        "    return os.getpid()\n",
        "sandbox_cleanup",
      ],
      [
        "a /work file still mapped",
        "import builtins, mmap\n" +
        "def f():\n" +
        "    with open('/work/mapped.bin', 'wb') as fh:\n" +
        "        fh.write(bytes(4096))\n" +
        "    with open('/work/mapped.bin', 'r+b') as fh:\n" +
        "        builtins._kcoral_map = mmap.mmap(fh.fileno(), 4096)\n" +
        "    return os.getpid()\n",
        "sandbox_cleanup",
      ],
      [
        "an audit hook (it would see every later request's file opens and imports)",
        "import sys\n" +
        "def f():\n" +
        "    sys.addaudithook(lambda event, args: None)\n" +
        "    return os.getpid()\n",
        "sandbox_cleanup",
      ],
    ];
    for (const [what, body, reason] of leftovers) {
      await t.step(
        `${what} retires the worker (${reason}); the next request succeeds`,
        async () => {
          const json = await run(server, `import os\n${body}`);
          const pid = out<number>(json);
          // The file checks run right after the answer (its worker_retired may follow it), but
          // the seat stays busy until they pass: the next request (one worker) runs elsewhere.
          const next = out<number>(
            await run(server, "import os\ndef f():\n    return os.getpid()\n"),
          );
          assert.notEqual(next, pid, "a new worker process serves the next request");
          const retired = server.events.filter((e) =>
            e.event === "worker_retired" && e.pid === pid
          );
          assert.deepEqual(retired.map((e) => e.reason), [reason]);
        },
      );
    }

    await t.step(
      "a /work file mapped with no descriptor left retires the worker right after the answer",
      async () => {
        // Only the mapping check finds it (no descriptor is left open).
        const json = await run(
          server,
          "import builtins, ctypes, os\n" +
            "def f():\n" +
            "    with open('/work/mapped-c.bin', 'wb') as fh:\n" +
            "        fh.write(bytes(4096))\n" +
            "    fd = os.open('/work/mapped-c.bin', os.O_RDONLY)\n" +
            "    libc = ctypes.CDLL(None)\n" +
            "    libc.mmap.restype = ctypes.c_void_p\n" +
            "    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,\n" +
            "                         ctypes.c_int, ctypes.c_int, ctypes.c_long]\n" +
            "    builtins._kcoral_map = libc.mmap(None, 4096, 1, 1, fd, 0)\n" +
            "    os.close(fd)\n" +
            "    return os.getpid()\n",
        );
        const pid = out<number>(json);
        const next = out<number>(
          await run(server, "import os\ndef f():\n    return os.getpid()\n"),
        );
        assert.notEqual(next, pid, "a new worker process serves the next request");
        const retired = server.events.filter((e) => e.event === "worker_retired" && e.pid === pid);
        assert.deepEqual(retired.map((e) => e.reason), ["sandbox_cleanup"]);
      },
    );

    await t.step("a background process is killed; the worker retires; next is clean", async () => {
      const marker = `kcoral-sandbox-bg-${tag}`;
      const json = await run(
        server,
        "import os, subprocess, sys\n" +
          "def f(marker):\n" +
          "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', marker])\n" +
          "    return os.getpid()\n",
        "f",
        [marker],
      );
      assert.equal(json.status, "FAILED");
      assert.equal((json.error as Json).message, LEFTOVER);
      assert.deepEqual(processesWith(marker), []);
      assert.ok(
        server.events.some((e) =>
          e.event === "worker_retired" && e.reason === "leftover_processes"
        ),
      );
      await assertServing(server);
      assert.deepEqual(processesWith(marker), []);
    });
  } finally {
    await server.stop();
  }
});

Deno.test("sandbox (simulated GPU): writable /proc, no device nodes, GPU sets", async (t) => {
  const server = await sandboxed({
    device: "gpu",
    simulateGpus: true,
    gpus: [0, 1],
    workersPerGpu: 1,
  });
  const tag = crypto.randomUUID();
  try {
    await t.step("/proc is writable for GPU workers", async () => {
      const result = await probe<{ comm: string; mount: string }>(
        server,
        "def f():\n" +
          "    try:\n" +
          "        open('/proc/self/comm', 'w').write('kcoral-gpu')\n" +
          "        comm = open('/proc/self/comm').read().strip()\n" +
          "    except OSError as exc:\n" +
          "        comm = 'errno %d' % exc.errno\n" +
          "    mount = [l.split()[3] for l in open('/proc/self/mounts') if l.split()[1] == '/proc']\n" +
          "    return json.dumps({'comm': comm, 'mount': mount[0].split(',')[0]})\n",
      );
      assert.deepEqual(result, { comm: "kcoral-gpu", mount: "rw" });
    });

    await t.step("environment, /dev and read-only system dirs in GPU mode", async () => {
      const result = await probe<Json>(
        server,
        `${ATTEMPTS.replace("def f(items)", "def attempts(items)")}\n` +
          "def f(names, tag):\n" +
          "    return json.dumps({'env': [os.environ.get(n) for n in names],\n" +
          "                       'visible': os.environ.get('CUDA_VISIBLE_DEVICES'),\n" +
          "                       'dev': sorted(os.listdir('/dev')),\n" +
          "                       'writes': json.loads(attempts([['write', '/usr/' + tag],\n" +
          "                                                      ['write', '/etc/' + tag]]))})\n",
        [KCORAL_DIRS, tag],
      );
      assert.deepEqual(
        result.env,
        KCORAL_DIRS.map((n) =>
          ({
            HOME: "/work/.kcoral/home",
            TMPDIR: "/work/.kcoral/tmp",
            XDG_CACHE_HOME: "/work/.kcoral/cache",
            CUDA_CACHE_PATH: "/work/.kcoral/cuda",
            TRITON_CACHE_DIR: "/work/.kcoral/triton",
            TORCH_EXTENSIONS_DIR: "/work/.kcoral/extensions",
          } as Record<string, string>)[n]
        ),
      );
      assert.match(String(result.visible), /^sim-[01]$/);
      // Simulated GPUs have no device node; NVIDIA control nodes may exist on a GPU host.
      const control = /^nvidia(ctl|-uvm|-uvm-tools|-caps)$/;
      assert.deepEqual((result.dev as string[]).filter((name) => !control.test(name)), [
        "fd",
        "full",
        "null",
        "random",
        "shm",
        "stderr",
        "stdin",
        "stdout",
        "urandom",
        "zero",
      ]);
      assert.deepEqual(result.writes, ["Errno:EROFS", "Errno:EROFS"]);
    });

    await t.step("files written by one request are gone for the next (fresh)", async () => {
      await assertCleanNextRequest(server, tag);
    });

    await t.step("a GPU-set request runs in its own sandbox over the seat's /work", async () => {
      const hostDirs = server.pool.seats.map((s) => s.workspaces.root);
      const { status, json } = await postProgram(server.url, {
        ...callProgram(
          "import os, json\n" +
            "def f(dirs):\n" +
            "    open('/work/set-file', 'w').write('x')\n" +
            "    return json.dumps({'cwd': os.getcwd(), 'visible': os.environ['CUDA_VISIBLE_DEVICES'],\n" +
            "                       'others': [os.path.exists(d) for d in dirs],\n" +
            "                       'tmp': os.path.realpath('/tmp')})\n",
          "f",
          [hostDirs],
        ),
        options: { gpu_count: 2 },
      });
      assert.equal(status, 200);
      assert.deepEqual(JSON.parse(out<string>(json)), {
        cwd: "/work",
        visible: "sim-0,sim-1",
        others: [false, false],
        tmp: "/work/.kcoral/tmp",
      });
      assert.equal(await inAnyWorkspace(server, "set-file"), false, "removed after");
      await assertServing(server);
    });
  } finally {
    await server.stop();
  }
});

Deno.test("sandbox: a failed probe (bwrap not on PATH) warns and still serves", async () => {
  const python = (await new Deno.Command("python3", {
    args: ["-c", "import sys; print(sys.executable)"],
    stdout: "piped",
  }).output()).stdout;
  const empty = await Deno.makeTempDir({ prefix: "kcoral-no-bwrap-" });
  let server: TestServer;
  try {
    // The server launches workers (and finds bwrap) with the environment it is given: no bwrap
    // on this PATH. The process environment is left alone (other test files run in parallel).
    server = await startServer({
      sandbox: "bubblewrap",
      python: new TextDecoder().decode(python).trim(),
      diskCacheDir: null,
    }, { env: { ...Deno.env.toObject(), PATH: empty } });
  } finally {
    await Deno.remove(empty);
  }
  try {
    assert.equal(server.app.sandbox, "none");
    const warnings = server.events.filter((e) => e.event === "sandbox_disabled");
    assert.equal(warnings.length, 1);
    assert.equal(warnings[0].level, "WARNING");
    assert.equal(
      warnings[0].error,
      "bubblewrap isolation requires bwrap on PATH; install bubblewrap",
    );
    assert.match(String(warnings[0].message), /WITHOUT isolation/);
    assert.equal(server.events.find((e) => e.event === "pool_ready")?.sandbox, "none");
    await assertServing(server);
    const cwd = out<string>(await run(server, "import os\ndef f():\n    return os.getcwd()\n"));
    assert.ok(cwd.startsWith(`${server.pool.seats[0].workspaces.root}/w`), cwd);
    assert.equal(await exists(cwd), false, "unsandboxed: the request's own host workspace, gone");
  } finally {
    await server.stop();
  }
});

Deno.test("sandbox: --sandbox-readonly-path adds a readable, importable directory", async (t) => {
  const scratch = await hostScratch();
  try {
    const dir = `${scratch}/tools`;
    const module = `kcoral_ro_${crypto.randomUUID().replaceAll("-", "")}`;
    await Deno.mkdir(dir);
    await Deno.writeTextFile(`${dir}/${module}.py`, "VALUE = 'from the read-only path'\n");
    await Deno.writeTextFile(`${dir}/data.txt`, "data\n");
    await Deno.writeTextFile(`${scratch}/private.txt`, "private\n");
    await t.step("readable and importable, not writable", async () => {
      const server = await sandboxed({ sandboxReadonlyPaths: [dir], diskCacheDir: null });
      try {
        const result = await probe<Json>(
          server,
          `import ${module}\n${ATTEMPTS.replace("def f(items)", "def attempts(items)")}\n` +
            "def f(dir, scratch):\n" +
            `    return json.dumps({'value': ${module}.VALUE, 'on_path': dir in __import__('sys').path,\n` +
            "                       'io': json.loads(attempts([['read', dir + '/data.txt'],\n" +
            "                                                  ['write', dir + '/data.txt'],\n" +
            "                                                  ['write', dir + '/new.py'],\n" +
            "                                                  ['exists', scratch + '/private.txt']]))})\n",
          [dir, scratch],
        );
        assert.deepEqual(result, {
          value: "from the read-only path",
          on_path: true,
          io: ["read:data\n", "Errno:EROFS", "Errno:EROFS", "absent"],
        });
        assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), [
          "data.txt",
          `${module}.py`,
        ]);
      } finally {
        await server.stop();
      }
    });

    const tmpBase = Deno.env.get("TMPDIR") || "/tmp";
    const refused: [string, string, RegExp][] = [
      ["/", "the root", /read-only runtime path contains sandbox workspaces: \/$/],
      [tmpBase, "an ancestor of the runtime dir", /read-only runtime path contains sandbox/],
      ["/work", "a directory the sandbox builds", /lies at, inside or above \/work/],
      ["/var", "a parent of /var/tmp", /lies at, inside or above \/var\/tmp/],
    ];
    for (const [path, what, message] of refused) {
      await t.step(`${what} (${path}) is refused at startup with a clear error`, async () => {
        const events: string[] = [];
        const app = createApp({
          device: "cpu",
          sandbox: "bubblewrap",
          sandboxReadonlyPaths: [path],
          diskCacheDir: null,
          logConsole: false,
        });
        app.subscribe((e) => events.push(String(e.event)));
        await assert.rejects(app.start(), (error: Error) => {
          assert.ok(error instanceof SandboxConfigError, String(error));
          assert.match(error.message, message);
          return true;
        });
        assert.ok(events.includes("server_start_failed"));
        assert.equal(events.includes("sandbox_disabled"), false, "never a silent fallback");
      });
    }

    await t.step("the interpreter's user site is importable iff it is outside", async () => {
      // A non-root `pip install` puts packages in the user site under $HOME, which the sandbox
      // replaces by /work/.kcoral/home: it must stay importable (read-only) where Python uses it.
      const base = `${scratch}/userbase`;
      const env = { ...Deno.env.toObject(), PYTHONUSERBASE: base };
      const module = `kcoral_user_${crypto.randomUUID().replaceAll("-", "")}`;
      const site = (await new Deno.Command("python3", {
        args: ["-c", "import site; print(site.getusersitepackages())"],
        env,
        stdout: "piped",
      }).output()).stdout;
      const siteDir = new TextDecoder().decode(site).trim();
      await Deno.mkdir(siteDir, { recursive: true });
      await Deno.writeTextFile(`${siteDir}/${module}.py`, "VALUE = 'user site'\n");
      const outside = (await new Deno.Command("python3", {
        args: ["-c", `import ${module}`],
        env,
        stderr: "null",
      }).output()).success;
      // The workers' environment only: tests run in parallel share this process's environment.
      const server = await sandboxed({ diskCacheDir: null }, { env });
      try {
        const inside = await probe<{ value: string | null; write: string }>(
          server,
          `${ATTEMPTS.replace("def f(items)", "def attempts(items)")}\n` +
            "def f(module, site_dir):\n" +
            "    try:\n" +
            "        value = __import__(module).VALUE\n" +
            "    except ImportError:\n" +
            "        value = None\n" +
            "    write = json.loads(attempts([['write', site_dir + '/new.py']]))[0]\n" +
            "    return json.dumps({'value': value, 'write': write})\n",
          [module, siteDir],
        );
        assert.deepEqual(inside, {
          value: outside ? "user site" : null,
          write: outside ? "Errno:EROFS" : "Errno:ENOENT",
        });
      } finally {
        await server.stop();
      }
    });

    await t.step("a path that does not exist fails the probe: warning, no isolation", async () => {
      const server = await startServer({
        sandbox: "bubblewrap",
        sandboxReadonlyPaths: [`${scratch}/missing`],
        diskCacheDir: null,
      });
      try {
        assert.equal(server.app.sandbox, "none");
        const warning = server.events.find((e) => e.event === "sandbox_disabled");
        assert.equal(warning?.error, `--sandbox-readonly-path does not exist: ${scratch}/missing`);
        await assertServing(server);
      } finally {
        await server.stop();
      }
    });

    await t.step("together with --sandbox none it is a configuration error", () => {
      assert.throws(
        () => createApp({ sandbox: "none", sandboxReadonlyPaths: [dir] }),
        (error: Error) =>
          error instanceof ConfigError &&
          error.message === "--sandbox-readonly-path requires --sandbox bubblewrap",
      );
    });
  } finally {
    await Deno.remove(scratch, { recursive: true });
  }
});
