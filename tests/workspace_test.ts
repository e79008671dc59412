/**
 * Every request runs in a working directory of its own, gone once it is answered, in every
 * mode: without a sandbox (the host directory is the program's cwd) and in bubblewrap (the
 * program sees `/work`; the host directory behind it is the request's own), fresh and reused.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Client, Program, type ReturnedFile, type ReturnedFolder } from "../mod.ts";
import { callProgram, postProgram, startServer, type TestServer } from "./_server.ts";

type Json = Record<string, unknown>;

function out<T>(json: Json): T {
  const value = (json.results as { out: { value: unknown } }).out.value;
  return (typeof value === "string" ? JSON.parse(value) : value) as T;
}

async function exists(path: string): Promise<boolean> {
  return await Deno.lstat(path).then(() => true, () => false);
}

/**
 * Runs a program that writes a marker into its workspace and waits a moment; meanwhile finds the
 * host directory holding the marker. Returns that directory and what the program saw.
 */
async function markedRun(
  server: TestServer,
): Promise<{ hostDir: string; seen: { cwd: string; listing: string[] } }> {
  const marker = `marker-${crypto.randomUUID()}`;
  const running = postProgram(
    server.url,
    callProgram(
      "import json, os, time\n" +
        "def f(marker):\n" +
        "    listing = sorted(os.listdir('.'))\n" +
        "    open(marker, 'w').write('x')\n" +
        "    time.sleep(0.5)\n" +
        "    return json.dumps({'cwd': os.getcwd(), 'listing': listing})\n",
      "f",
      [marker],
    ),
  );
  let hostDir: string | null = null;
  const deadline = Date.now() + 10_000;
  while (hostDir === null && Date.now() < deadline) {
    for (const seat of server.pool.seats) {
      for (const entry of [...Deno.readDirSync(seat.workspaces.root)]) {
        const dir = `${seat.workspaces.root}/${entry.name}`;
        if (await exists(`${dir}/${marker}`)) hostDir = dir;
      }
    }
    if (hostDir === null) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const { status, json } = await running;
  assert.equal(status, 200, JSON.stringify(json));
  assert.equal(json.status, "COMPLETED", JSON.stringify(json));
  assert.ok(hostDir, "the marker never appeared in a host workspace");
  return { hostDir, seen: out(json) };
}

for (const sandbox of ["none", "bubblewrap"] as const) {
  for (const maxRequestsPerWorker of [0, 1]) {
    const mode = `${sandbox}, ${maxRequestsPerWorker === 0 ? "reused" : "fresh"}`;
    Deno.test(`workspace (${mode}): each request's own directory, gone after`, async () => {
      const server = await startServer({ sandbox, maxRequestsPerWorker });
      try {
        assert.equal(server.app.sandbox, sandbox);
        const first = await markedRun(server);
        const second = await markedRun(server);
        // The request's host directory is gone once it has been answered.
        assert.equal(await exists(first.hostDir), false, first.hostDir);
        assert.equal(await exists(second.hostDir), false, second.hostDir);
        assert.notEqual(first.hostDir, second.hostDir);
        // Each starts empty (but for the sandbox's reserved directory).
        const empty = sandbox === "bubblewrap" ? [".kcoral"] : [];
        assert.deepEqual(first.seen.listing, empty);
        assert.deepEqual(second.seen.listing, empty);
        if (sandbox === "bubblewrap") {
          assert.equal(first.seen.cwd, "/work");
          assert.equal(second.seen.cwd, "/work");
        } else {
          assert.equal(first.seen.cwd, first.hostDir);
          assert.equal(second.seen.cwd, second.hostDir);
        }
        // Only the next request's (empty) workspace is left on each seat.
        await server.pool.settled();
        for (const seat of server.pool.seats) {
          const entries = [...Deno.readDirSync(seat.workspaces.root)].map((e) => e.name);
          assert.deepEqual(entries, [seat.workspaces.current]);
        }
      } finally {
        await server.stop();
      }
    });
  }
}

Deno.test("workspace (none, reused): uploaded files and returns; the cwd is gone after", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  const client = new Client(server.url);
  try {
    const value = new Uint8Array([...new TextEncoder().encode("safetensors contents"), 0, 255]);
    const program = new Program();
    program.uploadFile({ blob: value, path: "./assets//tensor" });
    const mod = program.upload({
      kind: "module",
      source: "import os\n" +
        "def main():\n" +
        "    data = open('assets/tensor', 'rb').read()\n" +
        "    os.makedirs('out/nested/empty')\n" +
        "    open('out/report', 'wb').write(data + b' report')\n" +
        "    return {'data': data, 'cwd': os.getcwd()}\n",
    });
    const result = program.run({ fn: program.getFunction({ module: mod, name: "main" }) });
    program.return_({ key: "file", value: result });
    program.returnFile({ key: "report", path: "out/report" });
    program.returnFolder({ key: "outputs", path: "out" });
    const cwds: string[] = [];
    for (let i = 0; i < 2; i++) {
      const outcome = await client.execute(program);
      assert.ok(outcome.completed, JSON.stringify(outcome.error));
      const file = outcome.get<Map<string, Uint8Array | string>>("file");
      assert.deepEqual([...(file.get("data") as Uint8Array)], [...value]);
      const cwd = file.get("cwd") as string;
      assert.equal(await exists(cwd), false, cwd);
      cwds.push(cwd);
      const report = outcome.get<ReturnedFile>("report");
      assert.equal(new TextDecoder().decode(report.bytes()).endsWith(" report"), true);
      const folder = outcome.get<ReturnedFolder>("outputs");
      assert.ok(folder.directories.includes("nested/empty"), JSON.stringify(folder.directories));
    }
    assert.notEqual(cwds[0], cwds[1]);
  } finally {
    await client.close();
    await server.stop();
  }
});

Deno.test("workspace (none, reused): an uploaded module imports, and a new version replaces it", async () => {
  const server = await startServer({ maxRequestsPerWorker: 0 });
  try {
    for (const version of ["one", "two"]) {
      const bytes = new TextEncoder().encode(`VERSION = '${version}'\n`);
      const sha = createHash("sha256").update(bytes).digest("hex");
      const { json } = await postProgram(server.url, {
        instructions: [
          { op: "upload", id: "file", kind: "file", blob: sha, path: "helper_mod.py" },
          ...callProgram(
            "import json\ndef f():\n    import helper_mod\n    return json.dumps(helper_mod.VERSION)\n",
            "f",
          )
            .instructions,
        ],
      }, { blobs: { [sha]: bytes } });
      assert.equal(json.status, "COMPLETED", JSON.stringify(json));
      assert.equal(out<string>(json), version);
    }
  } finally {
    await server.stop();
  }
});

Deno.test("workspace (bubblewrap): other workspaces are out of sight, no capability left", async () => {
  const server = await startServer({ sandbox: "bubblewrap", maxRequestsPerWorker: 0 });
  try {
    const { json } = await postProgram(
      server.url,
      callProgram(
        "import ctypes, json, os, subprocess\n" +
          "def f():\n" +
          "    c = ctypes.CDLL(None, use_errno=True)\n" +
          "    def attempt(result):\n" +
          "        return 'ok' if result == 0 else os.strerror(ctypes.get_errno())\n" +
          "    cap = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n" +
          "    sub = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True)\n" +
          "    sub_cap = [l.split()[1] for l in sub.stdout.splitlines() if l.startswith('CapEff')]\n" +
          "    return json.dumps({\n" +
          "        'ws': os.listdir('/kcoral/ws'),\n" +
          "        'cap': cap + sub_cap,\n" +
          "        'umount': attempt(c.umount2(b'/work', 2)),\n" +
          "        'bind': attempt(c.mount(b'/kcoral/runtime', b'/work', None, 4096, None)),\n" +
          "        'unshare': attempt(c.unshare(0x20000)),\n" +
          "    })\n",
        "f",
      ),
    );
    assert.equal(json.status, "COMPLETED", JSON.stringify(json));
    assert.deepEqual(out(json), {
      ws: [],
      cap: ["0000000000000000", "0000000000000000"],
      umount: "Operation not permitted",
      bind: "Operation not permitted",
      unshare: "Operation not permitted",
    });
  } finally {
    await server.stop();
  }
});

Deno.test("workspace (bubblewrap): a zygote that cannot switch exits rather than run elsewhere", async () => {
  const server = await startServer({ sandbox: "bubblewrap", maxRequestsPerWorker: 0 });
  try {
    const seat = server.pool.seats[0];
    const slot = seat.slot!;
    slot.switchWorkspace("w999999"); // no such directory: the bind fails
    await slot.closed;
    for (let i = 0; i < 100 && !slot.dead; i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(slot.dead);
    assert.match(slot.stderrTail(), /cannot switch the workspace to 'w999999'/);
    // The seat is replaced; requests are served again (the first may meet the dead slot).
    let served = false;
    for (let i = 0; i < 5 && !served; i++) {
      const { status, json } = await postProgram(
        server.url,
        callProgram("import json, os\ndef f():\n    return json.dumps(os.getcwd())\n", "f"),
      );
      served = status === 200 && json.status === "COMPLETED" && out<string>(json) === "/work";
    }
    assert.ok(served);
    assert.notEqual(seat.slot, slot);
  } finally {
    await server.stop();
  }
});
