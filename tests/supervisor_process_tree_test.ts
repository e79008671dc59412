/**
 * The supervisor's ownership of its server's process tree (node/supervisor/process_tree.ts,
 * spec router §5.1, §5.5): SIGTERM with and without a grace, SIGKILL of the group and every
 * descendant, descendants that escape with setsid() found through the subreaper and killed (and
 * reaped), while processes that are not the tree's survive. Real processes throughout.
 */
import assert from "node:assert/strict";
import {
  enableChildSubreaper,
  ProcessTree,
  TREE_MARKER_VARIABLE,
} from "../node/supervisor/process_tree.ts";
import { exists, isAlive, waitFor } from "./fixtures/supervisor/helpers.ts";

/** A shell command as a tree's child, its output discarded. */
function shell(script: string, log?: (line: string) => void): ProcessTree {
  return ProcessTree.spawn({ command: "sh", args: ["-c", script], env: {} }, {
    stdio: "null",
    log,
  });
}

/** Pids the shell wrote to `file`, one per line. */
function pids(file: string): number[] {
  try {
    return Deno.readTextFileSync(file).split("\n").filter((l) => l !== "").map(Number);
  } catch {
    return [];
  }
}

/** An escaper that ignores SIGTERM and records its pid (only double quotes inside). */
const ESCAPER = `trap "" TERM; echo $$ >> "$0"; exec sleep 300`;

Deno.test("process tree: this process becomes a child subreaper", () => {
  const state = enableChildSubreaper();
  assert.deepEqual(state, { enabled: true, reason: "" });
  assert.equal(enableChildSubreaper(), state); // once
  const status = Deno.readTextFileSync("/proc/self/status");
  assert.ok(status.length > 0);
});

Deno.test("process tree: the child runs in its own process group and session, stdin null", async () => {
  const file = await Deno.makeTempFile();
  try {
    const tree = shell(`cat > /dev/null; cut -d" " -f5,6 /proc/$$/stat > ${file}; sleep 30`);
    await waitFor("the child's report", () => Deno.readTextFileSync(file).trim() !== "");
    const [pgid, sid] = Deno.readTextFileSync(file).trim().split(/\s+/).map(Number);
    assert.equal(pgid, tree.pid);
    assert.equal(sid, tree.pid);
    await tree.terminate(5);
    await tree.cleanup();
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("process tree: SIGTERM that is obeyed needs no SIGKILL", async () => {
  const lines: string[] = [];
  const tree = shell("sleep 30 & wait", (line) => lines.push(line));
  await waitFor("the sleep", () => tree.descendants().length === 1);
  const status = await tree.terminate(5);
  await tree.cleanup();
  assert.equal(status.signal, "SIGTERM");
  assert.ok(!lines.some((l) => l.includes("SIGKILL")), lines.join("\n"));
  assert.deepEqual(tree.descendants(), []);
});

Deno.test("process tree: a child that ignores SIGTERM gets SIGKILL after the grace", async () => {
  const lines: string[] = [];
  const tree = shell(`trap "" TERM; sleep 30 & wait; wait`, (line) => lines.push(line));
  await waitFor("the sleep", () => tree.descendants().length === 1);
  const started = performance.now();
  const status = await tree.terminate(0.2);
  const elapsed = performance.now() - started;
  await tree.cleanup();
  assert.equal(status.signal, "SIGKILL");
  assert.ok(elapsed >= 190 && elapsed < 5_000, `${elapsed} ms`);
  // (The sleep may still be dying when the cleanup looks: then it is killed once more.)
  assert.equal(lines[0], "child did not stop after SIGTERM; sending SIGKILL");
  assert.equal(lines.filter((l) => l.includes("sending SIGKILL")).length, 1);
  assert.deepEqual(tree.descendants(), []);
});

Deno.test("process tree: without a grace, termination waits for the child to finish", async () => {
  const file = await Deno.makeTempFile();
  try {
    // On SIGTERM the child takes 0.4 s to finish its work, then exits 0.
    const tree = shell(
      `trap "sleep 0.4; echo done > ${file}; exit 0" TERM; echo ready > ${file}; sleep 30 & wait`,
    );
    await waitFor("the child's trap", () => Deno.readTextFileSync(file).trim() === "ready");
    const started = performance.now();
    const status = await tree.terminate(null);
    assert.ok(performance.now() - started >= 350);
    assert.equal(status.code, 0);
    assert.equal(Deno.readTextFileSync(file).trim(), "done");
    await tree.cleanup(); // the background sleep is killed here
    assert.deepEqual(tree.descendants(), []);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("process tree: descendants that setsid() are found, killed and reaped; others survive", async () => {
  const file = await Deno.makeTempFile();
  // Not the tree's: a child of this process, and an orphan re-parented to it.
  const unrelated = new Deno.Command("sleep", { args: ["30"] }).spawn();
  const unrelatedOrphanFile = await Deno.makeTempFile();
  const orphaner = new Deno.Command("sh", {
    args: ["-c", `setsid sh -c '${ESCAPER}' "$0" &`, unrelatedOrphanFile],
  }).spawn();
  await orphaner.status;
  const lines: string[] = [];
  // The tree: a worker that setsid()s and a grandchild orphaned at once, both ignoring SIGTERM,
  // under a child that ignores SIGTERM too.
  const escaper = `setsid sh -c '${ESCAPER}' ${file}`;
  const tree = shell(
    `trap "" TERM; ${escaper} & (${escaper} &); sleep 30 & wait; wait`,
    (line) => lines.push(line),
  );
  try {
    await waitFor("two escapers", () => pids(file).length === 2);
    await waitFor("the unrelated orphan", () => pids(unrelatedOrphanFile).length === 1);
    const escapers = pids(file);
    const [stranger] = pids(unrelatedOrphanFile);
    await waitFor(
      "both escapers in view",
      () => escapers.every((p) => tree.descendants().includes(p)),
    );
    // The orphaned one has left the tree: its parent is this process (the subreaper).
    const orphan = escapers.find((p) => {
      const stat = Deno.readTextFileSync(`/proc/${p}/stat`);
      return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === Deno.pid;
    });
    assert.ok(orphan !== undefined, "one escaper was re-parented to the subreaper");
    assert.ok(!tree.descendants().includes(unrelated.pid));
    assert.ok(!tree.descendants().includes(stranger));

    await tree.terminate(0.1);
    await tree.cleanup();
    for (const pid of escapers) {
      assert.ok(!exists(pid), `escaper ${pid} is gone (killed and reaped)`);
    }
    assert.ok(isAlive(unrelated.pid), "the unrelated child survives");
    assert.ok(isAlive(stranger), "the unrelated orphan survives");
    assert.ok(lines.includes("child did not stop after SIGTERM; sending SIGKILL"));
  } finally {
    await tree.kill();
    await tree.cleanup();
    for (const pid of pids(unrelatedOrphanFile)) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* gone */ }
    }
    unrelated.kill("SIGKILL");
    await unrelated.status;
    await Deno.remove(file);
    await Deno.remove(unrelatedOrphanFile);
  }
});

Deno.test("process tree: after the child exits on its own, its descendants are killed", async () => {
  const file = await Deno.makeTempFile();
  try {
    const tree = shell(`setsid sh -c '${ESCAPER}' ${file} & sleep 0.2; exit 7`);
    await waitFor("the escaper", () => pids(file).length === 1);
    const [escaper] = pids(file);
    const status = await tree.exited;
    assert.equal(status.code, 7);
    assert.ok(isAlive(escaper), "still alive after the child's exit");
    assert.ok(tree.descendants().includes(escaper), "found from this process");
    await tree.cleanup();
    assert.ok(!exists(escaper));
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("process tree: each tree's child carries a marker of its own", async () => {
  const file = await Deno.makeTempFile();
  try {
    const tree = shell(`echo "$${TREE_MARKER_VARIABLE}" > ${file}`);
    await tree.exited;
    await tree.cleanup();
    const marker = Deno.readTextFileSync(file).trim();
    assert.match(marker, /^[0-9a-f-]{36}$/);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("process tree: spawning a missing program throws", () => {
  assert.throws(
    () => ProcessTree.spawn({ command: "/nonexistent/kcoral", args: [], env: {} }),
    Deno.errors.NotFound,
  );
});

Deno.test("process tree: without FFI it falls back to the process group and says so", async () => {
  const module = new URL("../node/supervisor/process_tree.ts", import.meta.url).href;
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(
      script,
      `import { ProcessTree } from ${JSON.stringify(module)};
      const lines: string[] = [];
      const log = (line: string) => lines.push(line);
      const tree = ProcessTree.spawn({ command: "sleep", args: ["30"], env: {} }, { log });
      const status = await tree.terminate(1);
      await tree.cleanup();
      console.log(JSON.stringify({ lines, signal: status.signal }));`,
    );
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--no-check", "--allow-run", "--allow-read", "--allow-env", script],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(output.success, new TextDecoder().decode(output.stderr));
    const { lines, signal } = JSON.parse(new TextDecoder().decode(output.stdout));
    assert.equal(signal, "SIGTERM");
    // Without --allow-all, Deno also refuses /proc: only the process group is left.
    assert.equal(lines.length, 2, lines.join("\n"));
    assert.match(
      lines[0],
      /cannot become a child subreaper \(no FFI: .*\); falling back to process-group kill/,
    );
    assert.match(lines[1], /cannot read \/proc \(.*\); only the process group is killed/);
  } finally {
    await Deno.remove(script);
  }
});
