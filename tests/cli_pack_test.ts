// Tests of `--send` packing (cli/run/pack.ts, cli/run/tar.ts): the seed's layout table and
// input rules, deterministic bytes, and that Python's tarfile and the uploaded runner
// (runtime_py/kcoral_runtime/tools/runner.py, exec'd like the worker does) read the archive.

import assert from "node:assert/strict";
import { outputWithInput } from "./_child.ts";
import { type PackedInputs, PackError, packInputs } from "../cli/run/pack.ts";
import { readToolSources } from "../cli/run/sources.ts";
import { writeTar } from "../cli/run/tar.ts";
import { TOOL_NAMES, TOOLS } from "../cli/run/tools.ts";

const RUNNER = new URL("../runtime_py/kcoral_runtime/tools/runner.py", import.meta.url);
const encoder = new TextEncoder();

function assertEquals(actual: unknown, expected: unknown, message?: string): void {
  assert.deepStrictEqual(actual, expected, message);
}

interface TempDir extends AsyncDisposable {
  path: string;
}

// A temporary directory removed when the `await using` binding goes out of scope.
async function tempDir(prefix: string): Promise<TempDir> {
  const path = await Deno.makeTempDir({ prefix });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

async function tree(files: Record<string, string | [string, number]>): Promise<TempDir> {
  const temp = await tempDir("kcoral-pack-");
  const root = temp.path;
  for (const [name, spec] of Object.entries(files)) {
    const [content, mode] = typeof spec === "string" ? [spec, 0o644] : spec;
    const path = `${root}/${name}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(path, content);
    await Deno.chmod(path, mode);
  }
  return temp;
}

function names(packed: PackedInputs): string[] {
  return packed.files.map((file) => file.name);
}

async function rejects(promise: Promise<unknown>, message: string): Promise<void> {
  await assert.rejects(promise, (error: unknown) => {
    assert.ok(error instanceof PackError, `not a PackError: ${error}`);
    assertEquals(error.message, message);
    return true;
  });
}

async function python(script: string, input: Uint8Array, ...args: string[]): Promise<string> {
  const { code, stdout, stderr } = await outputWithInput("python3", ["-c", script, ...args], input);
  const text = new TextDecoder().decode(stderr);
  assertEquals(code, 0, text);
  return new TextDecoder().decode(stdout);
}

interface _Member {
  name: string;
  mode: number;
  size: number;
  type: string;
  mtime: number;
  uid: number;
  gid: number;
  uname: string;
  gname: string;
  data: string;
}

// Python's tarfile reads the archive (strict: no ignore_zeros).
async function readWithTarfile(tar: Uint8Array): Promise<_Member[]> {
  const script = `
import base64, io, json, sys, tarfile
members = []
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r:") as tar:
    for m in tar:
        data = tar.extractfile(m).read() if m.isfile() else b""
        members.append(dict(name=m.name, mode=m.mode, size=m.size, type=m.type.decode(),
            mtime=m.mtime, uid=m.uid, gid=m.gid, uname=m.uname, gname=m.gname,
            data=base64.b64encode(data).decode()))
print(json.dumps(members))
`;
  return JSON.parse(await python(script, tar));
}

// The uploaded runner, exec'd in a fresh namespace as the worker does, unpacks the archive.
async function unpackWithRunner(tar: Uint8Array): Promise<TempDir> {
  const temp = await tempDir("kcoral-unpack-");
  const target = temp.path;
  const script = `
import sys
source = open(sys.argv[1], encoding="utf-8").read()
namespace = {}
exec(compile(source, "<uploaded:runner>", "exec"), namespace)
namespace["unpack_inputs"](sys.stdin.buffer.read(), sys.argv[2])
`;
  await python(script, tar, RUNNER.pathname, target);
  return temp;
}

async function mode(path: string): Promise<number> {
  return (await Deno.stat(path)).mode! & 0o777;
}

function base64(text: string): string {
  return btoa(String.fromCharCode(...encoder.encode(text)));
}

Deno.test("layout table: files by name, directories keep their name and layout", async () => {
  await using rootDir = await tree({
    "experiment/check.py": "print('check')\n",
    "experiment/data/input.json": "{}",
  });
  const root = rootDir.path;
  const directory = ["experiment/check.py", "experiment/data/input.json"];
  assertEquals(names(await packInputs(["experiment/check.py"], root)), ["check.py"]);
  const relative = await packInputs(["experiment"], root);
  assertEquals(names(relative), directory);
  const absolute = await packInputs([`${root}/experiment`], "/");
  assertEquals(names(absolute), directory);
  const dot = await packInputs(["."], `${root}/experiment`);
  assertEquals(names(dot), directory);
  for (
    const spelling of ["experiment/", "experiment//", "./experiment/./", `${root}/experiment/`]
  ) {
    assertEquals((await packInputs([spelling], root)).tar, relative.tar, spelling);
  }
  assertEquals(absolute.tar, relative.tar);
  assertEquals(dot.tar, relative.tar);
  assertEquals(relative.files, [
    { name: "experiment/check.py", size: 15, executable: false },
    { name: "experiment/data/input.json", size: 2, executable: false },
  ]);
  // `..` names the parent by its real name; a file spelled with a trailing slash is the file.
  assertEquals(names(await packInputs([".."], `${root}/experiment/data`)), directory);
  assertEquals(names(await packInputs(["experiment/check.py/"], root)), ["check.py"]);
});

Deno.test("names are kept: a directory and a file inside it do not conflict", async () => {
  await using rootDir = await tree({ "experiment/run.sh": ["#!/bin/sh\necho run\n", 0o755] });
  const root = rootDir.path;
  const packed = await packInputs(["experiment", "experiment/run.sh"], root);
  assertEquals(packed.files, [
    { name: "experiment/run.sh", size: 19, executable: true },
    { name: "run.sh", size: 19, executable: true },
  ]);
  await using unpackedDir = await unpackWithRunner(packed.tar);
  const unpacked = unpackedDir.path;
  assertEquals(await Deno.readTextFile(`${unpacked}/experiment/run.sh`), "#!/bin/sh\necho run\n");
  assertEquals(await Deno.readTextFile(`${unpacked}/run.sh`), "#!/bin/sh\necho run\n");
  assertEquals(await mode(`${unpacked}/experiment/run.sh`), 0o700);
});

Deno.test("the filesystem root cannot be selected", async () => {
  await rejects(packInputs(["/"]), "input directory must have a name: /");
  await rejects(packInputs(["//"]), "input directory must have a name: //");
});

Deno.test("missing paths and symlinks are refused", async () => {
  await using rootDir = await tree({ "experiment/check.py": "x", "other/file.txt": "y" });
  const root = rootDir.path;
  await Deno.symlink(`${root}/experiment/check.py`, `${root}/link`);
  await Deno.symlink(`${root}/experiment`, `${root}/dirlink`);
  await rejects(packInputs(["missing"], root), "input must exist and not be a symlink: missing");
  await rejects(packInputs(["link"], root), "input must exist and not be a symlink: link");
  await rejects(packInputs(["dirlink/"], root), "input must exist and not be a symlink: dirlink");
  await rejects(
    packInputs(["experiment/check.py/x"], root),
    "input must exist and not be a symlink: experiment/check.py/x",
  );
  await Deno.symlink("../other", `${root}/experiment/zlinkdir`);
  await rejects(
    packInputs(["experiment"], root),
    "symlink inputs are not supported: experiment/zlinkdir",
  );
  await Deno.remove(`${root}/experiment/zlinkdir`);
  await Deno.symlink("/nonexistent/target", `${root}/experiment/dangling`);
  await rejects(
    packInputs(["experiment"], root),
    "symlink inputs are not supported: experiment/dangling",
  );
  await rejects(
    packInputs(["."], `${root}/experiment`),
    "symlink inputs are not supported: dangling",
  );
});

Deno.test("special files are refused", async () => {
  await using rootDir = await tree({ "experiment/check.py": "x" });
  const root = rootDir.path;
  const fifo = new Deno.Command("mkfifo", { args: [`${root}/experiment/pipe`, `${root}/pipe`] });
  assertEquals((await fifo.output()).code, 0);
  await rejects(packInputs(["experiment"], root), "input is not a regular file: experiment/pipe");
  await rejects(packInputs(["pipe"], root), "input is not a regular file: pipe");
  await rejects(packInputs(["/dev/null"]), "input is not a regular file: /dev/null");
});

Deno.test("__pycache__ below a sent directory is skipped, explicit selections are kept", async () => {
  await using rootDir = await tree({
    "experiment/check.py": "x",
    "experiment/__pycache__/check.cpython-311.pyc": "pyc",
    "experiment/pkg/__pycache__/mod.pyc": "pyc",
    "experiment/pkg/mod.py": "m",
    "experiment/other/__pycache__": "a file named __pycache__",
    "build/__pycache__/tool/run.py": "r",
  });
  const root = rootDir.path;
  await Deno.symlink("/etc/passwd", `${root}/experiment/__pycache__/link`);
  assertEquals(names(await packInputs(["experiment"], root)), [
    "experiment/check.py",
    "experiment/pkg/mod.py",
  ]);
  // Decision: only components below the selected root count (upstream also dropped these).
  assertEquals(names(await packInputs(["build/__pycache__/tool"], root)), ["tool/run.py"]);
  assertEquals(names(await packInputs(["experiment/pkg/__pycache__"], root)), [
    "__pycache__/mod.pyc",
  ]);
  assertEquals(names(await packInputs(["experiment/pkg/__pycache__/mod.pyc"], root)), ["mod.pyc"]);
});

Deno.test("empty directories are skipped, hidden files are kept", async () => {
  await using rootDir = await tree({
    "experiment/.env": "SECRET=1",
    "experiment/.git/config": "[core]",
    "experiment/visible.txt": "v",
  });
  const root = rootDir.path;
  await Deno.mkdir(`${root}/experiment/empty/deeper`, { recursive: true });
  await Deno.mkdir(`${root}/only-empty/a/b`, { recursive: true });
  assertEquals(names(await packInputs(["experiment"], root)), [
    "experiment/.env",
    "experiment/.git/config",
    "experiment/visible.txt",
  ]);
  const empty = await packInputs(["only-empty"], root);
  assertEquals(empty.files, []);
  assertEquals(empty.tar, new Uint8Array(10240));
});

Deno.test("only the executable bit of the mode survives", async () => {
  await using rootDir = await tree({
    "x/a-755": ["a", 0o755],
    "x/b-644": ["b", 0o644],
    "x/c-100": ["c", 0o100],
    "x/d-610": ["d", 0o610],
    "x/e-001": ["e", 0o601],
    "x/f-600": ["f", 0o600],
  });
  const root = rootDir.path;
  const packed = await packInputs(["x"], root);
  const expected = [0o700, 0o600, 0o700, 0o700, 0o700, 0o600];
  assertEquals(packed.files.map((file) => file.executable), expected.map((m) => m === 0o700));
  const members = await readWithTarfile(packed.tar);
  assertEquals(members.map((member) => member.mode), expected);
  await using unpackedDir = await unpackWithRunner(packed.tar);
  const unpacked = unpackedDir.path;
  for (const [index, name] of ["a-755", "b-644", "c-100", "d-610", "e-001", "f-600"].entries()) {
    assertEquals(await mode(`${unpacked}/x/${name}`), expected[index], name);
  }
});

Deno.test("duplicate or conflicting remote paths are refused", async () => {
  await using rootDir = await tree({
    "experiment/check.py": "x",
    "experiment/data/input.json": "{}",
    "one/check.py": "1",
    "two/check.py": "2",
    "files/a": "file a",
    "dirs/a/b": "file a/b",
  });
  const root = rootDir.path;
  await rejects(
    packInputs(["experiment", "experiment"], root),
    "duplicate or conflicting input path: experiment/check.py",
  );
  await rejects(
    packInputs(["experiment", `${root}/experiment/`], root),
    "duplicate or conflicting input path: experiment/check.py",
  );
  await rejects(
    packInputs(["one/check.py", "two/check.py"], root),
    "duplicate or conflicting input path: check.py",
  );
  await rejects(
    packInputs(["files/a", "dirs/a"], root),
    "duplicate or conflicting input path: a/b",
  );
  await rejects(packInputs(["dirs/a", "files/a"], root), "duplicate or conflicting input path: a");
  // Differently named directories may hold identically named files.
  assertEquals(names(await packInputs(["one", "two"], root)), ["one/check.py", "two/check.py"]);
});

Deno.test("the same contents give the same bytes", async () => {
  await using rootDir = await tree({
    "experiment/run.sh": ["#!/bin/sh\n", 0o755],
    "experiment/data.txt": ["data", 0o644],
  });
  const root = rootDir.path;
  const before = await packInputs(["experiment", "experiment/run.sh"], root);
  await Deno.utime(`${root}/experiment/run.sh`, 1, 1);
  await Deno.utime(`${root}/experiment/data.txt`, 2_000_000_000, 2_000_000_000);
  await Deno.chmod(`${root}/experiment/data.txt`, 0o640);
  await Deno.chmod(`${root}/experiment/run.sh`, 0o700);
  const after = await packInputs(["experiment", "experiment/run.sh"], root);
  assertEquals(after.tar, before.tar);
  await using copyDir = await tree({ "nested/experiment/run.sh": ["#!/bin/sh\n", 0o711] });
  const copy = copyDir.path;
  await Deno.writeTextFile(`${copy}/nested/experiment/data.txt`, "data");
  await Deno.chmod(`${copy}/nested/experiment/data.txt`, 0o600);
  const elsewhere = await packInputs(["experiment", "experiment/run.sh"], `${copy}/nested`);
  assertEquals(elsewhere.tar, before.tar);
  await Deno.writeTextFile(`${root}/experiment/data.txt`, "DATA");
  assert.notDeepStrictEqual((await packInputs(["experiment"], root)).tar, before.tar);
});

Deno.test("Python's tarfile reads the archive: names, modes, contents, fixed metadata", async () => {
  const long = `${"deep-directory-name/".repeat(6)}file-with-a-long-name.txt`;
  await using rootDir = await tree({
    [`experiment/${long}`]: "long",
    "experiment/ünïcødé/ファイル.txt": "unicode",
    [`experiment/${"x".repeat(89)}`]: "exactly 100 bytes with the prefix",
    "experiment/binary.bin": "",
  });
  const root = rootDir.path;
  await Deno.writeFile(`${root}/experiment/binary.bin`, new Uint8Array([0, 255, 10, 13]));
  const packed = await packInputs(["experiment"], root);
  const members = await readWithTarfile(packed.tar);
  assertEquals(members.map((member) => member.name), names(packed));
  assert.ok(encoder.encode(names(packed)[1]).length > 100);
  const byName = Object.fromEntries(members.map((member) => [member.name, member]));
  assertEquals(byName[`experiment/${long}`].data, base64("long"));
  assertEquals(byName["experiment/ünïcødé/ファイル.txt"].data, base64("unicode"));
  assertEquals(byName["experiment/binary.bin"].data, btoa("\x00\xff\n\r"));
  for (const member of members) {
    assertEquals(
      [member.type, member.mtime, member.uid, member.gid, member.uname, member.gname],
      ["0", 0, 0, 0, "", ""],
    );
    assertEquals(member.mode, 0o600);
  }
  await using unpackedDir = await unpackWithRunner(packed.tar);
  const unpacked = unpackedDir.path;
  assertEquals(await Deno.readTextFile(`${unpacked}/experiment/${long}`), "long");
  assertEquals(await Deno.readTextFile(`${unpacked}/experiment/ünïcødé/ファイル.txt`), "unicode");
  assertEquals(
    await Deno.readFile(`${unpacked}/experiment/binary.bin`),
    new Uint8Array([0, 255, 10, 13]),
  );
});

Deno.test("the archive matches what Python's tarfile writes for the same members", async () => {
  await using rootDir = await tree({
    "experiment/check.py": ["print(1)\n", 0o755],
    [`experiment/${"long/".repeat(25)}name.txt`]: "long",
    "experiment/ünï.txt": "u",
    "solo.txt": "",
  });
  const root = rootDir.path;
  const packed = await packInputs(["experiment", "solo.txt"], root);
  const script = `
import io, json, sys, tarfile
buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for entry in json.loads(sys.argv[1]):
        data = open(entry["path"], "rb").read()
        info = tarfile.TarInfo(entry["name"])
        info.size, info.mode = len(data), 0o700 if entry["executable"] else 0o600
        tar.addfile(info, io.BytesIO(data))
sys.stdout.write(buffer.getvalue().hex())
`;
  const entries = packed.files.map((file) => ({ ...file, path: `${root}/${file.name}` }));
  const hex = await python(script, new Uint8Array(), JSON.stringify(entries));
  const reference = new Uint8Array(hex.match(/../g)!.map((byte) => parseInt(byte, 16)));
  // Python releases differ only in devmajor/devminor of regular files (blank in newer ones,
  // "0000000" in older ones) and therefore in the checksum; compare without those fields.
  assertEquals(_withoutDeviceFields(packed.tar), _withoutDeviceFields(reference));
});

function _withoutDeviceFields(tar: Uint8Array): Uint8Array {
  const copy = tar.slice();
  for (let offset = 0; offset + 512 <= copy.length && copy[offset] !== 0;) {
    copy.fill(0, offset + 148, offset + 156);
    copy.fill(0, offset + 329, offset + 345);
    const size = parseInt(new TextDecoder().decode(copy.slice(offset + 124, offset + 135)), 8);
    offset += 512 + Math.ceil(size / 512) * 512;
  }
  return copy;
}

Deno.test("no selection gives a valid empty archive", async () => {
  const packed = await packInputs([]);
  assertEquals(packed.files, []);
  assertEquals(packed.tar, new Uint8Array(10240));
  assertEquals(writeTar([]), packed.tar);
  assertEquals(await readWithTarfile(packed.tar), []);
  await using unpackedDir = await unpackWithRunner(packed.tar);
  const unpacked = unpackedDir.path;
  assertEquals(Array.from(Deno.readDirSync(unpacked)), []);
});

Deno.test("tar writer: sizes pad to blocks and records; PAX only when needed", () => {
  const data = new Uint8Array(513).fill(7);
  const tar = writeTar([{ name: "a.bin", data, mode: 0o700 }]);
  assertEquals(tar.length, 10240);
  assertEquals(new TextDecoder().decode(tar.slice(0, 5)), "a.bin");
  assertEquals(new TextDecoder().decode(tar.slice(100, 108)), "0000700\0");
  assertEquals(new TextDecoder().decode(tar.slice(124, 136)), "00000001001\0");
  assertEquals(new TextDecoder().decode(tar.slice(257, 265)), "ustar\x0000");
  assertEquals(tar.slice(512, 1025), data);
  assertEquals(tar.slice(1025), new Uint8Array(10240 - 1025));
  const blocks = (count: number) =>
    writeTar(
      Array.from({ length: count }, (_, index) => ({
        name: `f${index}`,
        data: new Uint8Array(512),
        mode: 0o600,
      })),
    ).length;
  assertEquals(blocks(9), 10240, "9 * 1024 + 1024 end bytes fill one record exactly");
  assertEquals(blocks(10), 20480, "one more member needs a second record");
  const pax = writeTar([{ name: `${"n".repeat(101)}`, data: new Uint8Array(), mode: 0o600 }]);
  assertEquals(new TextDecoder().decode(pax.slice(0, 14)), "././@PaxHeader");
  assertEquals(pax[156], "x".charCodeAt(0));
  assertEquals(
    new TextDecoder().decode(pax.slice(512, 512 + 111)),
    `111 path=${"n".repeat(101)}\n`,
  );
});

Deno.test("PackError is an Error with its own name", () => {
  const error = new PackError("input is not a regular file: x", { cause: new Error("inner") });
  assert.ok(error instanceof Error);
  assertEquals(error.name, "PackError");
  assertEquals(error.message, "input is not a regular file: x");
});

Deno.test("tool sources: the runner and every definition are readable for upload", async () => {
  const runnerText = await Deno.readTextFile(RUNNER);
  for (const tool of TOOL_NAMES) {
    const sources = await readToolSources(tool);
    assertEquals(sources.runner, runnerText);
    const file = new URL(
      `../runtime_py/kcoral_runtime/tools/${TOOLS[tool].module}.py`,
      import.meta.url,
    );
    assertEquals(sources.definition, await Deno.readTextFile(file));
    assert.match(sources.definition, /^def run\(arguments, env, reports, execute\):$/m);
  }
  assert.match(runnerText, /^def run\(archive, tool_run, arguments, overrides, fetch\):$/m);
});
