/**
 * A seat's workspaces are reused after being emptied in place: whatever a program left or broke
 * in one, the next workspace made from it is empty, mode 0700, and (sandboxed) holds exactly the
 * empty reserved directories.
 *
 * @module
 */
import assert from "node:assert/strict";
import { emptyDirectory, RESERVED_DIR, RESERVED_SUBDIRS, SeatWorkspaces } from "./workspace.ts";

/** Entries under `dir` (recursively), each with its mode, sorted. */
function layout(dir: string, prefix = ""): string[] {
  const out: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = `${dir}/${entry.name}`;
    const mode = (Deno.lstatSync(path).mode ?? 0) & 0o7777;
    out.push(`${prefix}${entry.name} ${mode.toString(8)}`);
    if (entry.isDirectory) out.push(...layout(path, `${prefix}${entry.name}/`));
  }
  return out.sort();
}

/** Makes every directory under `dir` (itself included) writable by its owner, so it can go. */
function writable(dir: string): void {
  Deno.chmodSync(dir, 0o700);
  for (const entry of Deno.readDirSync(dir)) {
    if (entry.isDirectory) writable(`${dir}/${entry.name}`);
  }
}

const EMPTY_SANDBOXED = [
  `${RESERVED_DIR} 700`,
  ...RESERVED_SUBDIRS.map((sub) => `${RESERVED_DIR}/${sub} 700`),
].sort();

/** What a program may leave behind or break in a sandboxed workspace. */
const LEFTOVERS: Record<string, (path: string) => void> = {
  "files, a tree and a read-only directory": (path) => {
    Deno.writeTextFileSync(`${path}/out.txt`, "x");
    Deno.mkdirSync(`${path}/a/b`, { recursive: true });
    Deno.writeTextFileSync(`${path}/a/b/c`, "x");
    Deno.chmodSync(`${path}/a`, 0o500);
  },
  "large files (unlinked off the event loop), one read-only, beside small ones": (path) => {
    const large = new Uint8Array(1 << 20);
    Deno.writeFileSync(`${path}/part-0`, large);
    Deno.writeFileSync(`${path}/locked.bin`, large, { mode: 0o400 });
    Deno.writeTextFileSync(`${path}/${RESERVED_DIR}/tmp/small`, "x");
    Deno.writeFileSync(`${path}/${RESERVED_DIR}/tmp/large`, large);
  },
  "the reserved directory removed": (path) => {
    Deno.removeSync(`${path}/${RESERVED_DIR}`, { recursive: true });
  },
  "a file in place of the reserved directory": (path) => {
    Deno.removeSync(`${path}/${RESERVED_DIR}`, { recursive: true });
    Deno.writeTextFileSync(`${path}/${RESERVED_DIR}`, "x");
  },
  "a symlink for a reserved subdirectory, files in others, modes changed": (path) => {
    const reserved = `${path}/${RESERVED_DIR}`;
    Deno.removeSync(`${reserved}/home`);
    Deno.symlinkSync("/", `${reserved}/home`);
    Deno.writeTextFileSync(`${reserved}/tmp/scratch`, "x");
    Deno.writeTextFileSync(`${reserved}/extra`, "x");
    Deno.chmodSync(`${reserved}/cache`, 0o755);
    Deno.chmodSync(reserved, 0o777);
    Deno.chmodSync(path, 0o755);
  },
  "a subdirectory missing": (path) => {
    Deno.removeSync(`${path}/${RESERVED_DIR}/triton`);
  },
};

for (const sandboxed of [true, false]) {
  Deno.test(`seat workspaces (${sandboxed ? "sandboxed" : "plain"}): each new one is empty whatever the last one left`, async () => {
    const root = await Deno.makeTempDir();
    try {
      const workspaces = new SeatWorkspaces(`${root}/ws`, `${root}/trash`, sandboxed);
      const expected = sandboxed ? EMPTY_SANDBOXED : [];
      // Without a sandboxed layout only the first applies.
      const leftovers = Object.entries(LEFTOVERS).slice(0, sandboxed ? undefined : 1);
      // Each leftover twice over: with two spares in hand, every emptied directory comes back.
      for (const [what, leave] of [...leftovers, ...leftovers]) {
        const name = await workspaces.create();
        const path = workspaces.hostPath;
        assert.deepEqual(layout(path), expected, `a new workspace after: ${what}`);
        assert.equal((Deno.lstatSync(path).mode ?? 0) & 0o7777, 0o700);
        leave(path);
        await workspaces.retire(name);
        assert.ok(!(await Deno.stat(path).then(() => true, () => false)), "its path is gone");
      }
      await workspaces.create();
      assert.deepEqual(layout(workspaces.hostPath), expected);
    } finally {
      await Deno.remove(root, { recursive: true }).catch(async () => {
        writable(root);
        await Deno.remove(root, { recursive: true });
      });
    }
  });
}

Deno.test("emptyDirectory: what a request left is removed", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/part`, "x");
  await emptyDirectory(dir);
  assert.equal([...Deno.readDirSync(dir)].length, 0);
  await Deno.remove(dir);
});
