/**
 * The runtime's file list (`runtime_py/runtime_file_list.ts`) matches the package, each text
 * import reads its file, a copy written into the cache runs, and the files are in the module
 * graph of the CLI, so `deno compile` and Deno's module cache hold them without `--include`.
 */
import assert from "node:assert/strict";
import { fileListText, runtimePaths } from "../scripts/runtime_manifest.ts";
import { readRuntimeFile, RUNTIME_FILE_PATHS } from "../runtime_py/runtime_files.ts";
import { runtimePythonPath } from "../server/runtime/runtime_files.ts";
import { runtimeManifest } from "../server/runtime/runtime_manifest.ts";
import { readRuntimeFiles } from "../runtime_py/runtime_files.ts";

const PACKAGE = new URL("../runtime_py/kcoral_runtime/", import.meta.url);
const ROOT = new URL("../", import.meta.url);

Deno.test("runtime files: the list names exactly the package's Python files", async () => {
  const stale = "runtime_py/runtime_file_list.ts is out of date: run `deno task runtime-manifest`";
  assert.deepEqual([...RUNTIME_FILE_PATHS], await runtimePaths(PACKAGE), stale);
  const text = await Deno.readTextFile(new URL("runtime_py/runtime_file_list.ts", ROOT));
  assert.equal(text, fileListText(await runtimePaths(PACKAGE)), stale);
});

Deno.test("runtime files: each text import reads its file's bytes", async () => {
  const decoder = new TextDecoder("utf-8", { fatal: true });
  for (const path of RUNTIME_FILE_PATHS) {
    assert.equal(
      await readRuntimeFile(path),
      decoder.decode(await Deno.readFile(new URL(path, PACKAGE))),
      path,
    );
  }
  await assert.rejects(readRuntimeFile("tools/missing.py"), /deno task runtime-manifest/);
});

Deno.test("runtime files: `deno task runtime-manifest` rewrites the list and nothing else", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  const command: string = config.tasks["runtime-manifest"].command;
  assert.match(command, /scripts\/runtime_manifest\.ts$/);
  assert.match(command, /--allow-write=runtime_py\/runtime_file_list\.ts(\s|$)/);
});

Deno.test("runtime files: a copy written into the cache is importable by Python", async () => {
  const cacheDir = await Deno.makeTempDir();
  try {
    // `standalone`: as a compiled binary, whose embedded tree Python cannot open itself.
    const path = await runtimePythonPath({ standalone: true, cacheDir });
    assert.equal(path, `${cacheDir}/runtime/${runtimeManifest(await readRuntimeFiles()).hash}`);
    const output = await new Deno.Command("python3", {
      args: [
        "-c",
        "import kcoral_runtime.zygote, kcoral_runtime.tools.runner; print(kcoral_runtime.__file__)",
      ],
      env: { PYTHONPATH: path },
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(new TextDecoder().decode(output.stderr), "");
    assert.equal(
      new TextDecoder().decode(output.stdout).trim(),
      `${path}/kcoral_runtime/__init__.py`,
    );
  } finally {
    await Deno.remove(cacheDir, { recursive: true });
  }
});

Deno.test("runtime files: every runtime file is a text import in the CLI's module graph", async () => {
  // `deno compile` embeds the module graph (with its statically named dynamic imports), and
  // `deno run`/`deno cache` keep its remote modules in DENO_DIR: what `deno info` lists here.
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "cli.ts"],
    cwd: decodeURIComponent(ROOT.pathname),
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(output.success, new TextDecoder().decode(output.stderr));
  const graph = JSON.parse(new TextDecoder().decode(output.stdout)) as {
    modules: {
      specifier: string;
      dependencies?: { code?: { specifier: string }; assertionType?: string }[];
    }[];
  };
  const textImports = new Set<string>();
  for (const module of graph.modules) {
    for (const dependency of module.dependencies ?? []) {
      if (dependency.assertionType === "text" && dependency.code) {
        textImports.add(dependency.code.specifier);
      }
    }
  }
  for (const path of RUNTIME_FILE_PATHS) {
    assert.ok(textImports.has(new URL(path, PACKAGE).href), `${path} is not in the graph`);
  }
});

Deno.test("runtime files: `deno task compile` needs no --include for the runtime, only for workers", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  const command: string = config.tasks.compile.command;
  const includes = [...command.matchAll(/--include (\S+)/g)].map((m) => m[1]);
  assert.ok(!includes.some((path) => path.startsWith("runtime_py")), command);
  // Workers are loaded by URL at run time, so `deno compile` embeds only those named.
  const workers: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    for await (const entry of Deno.readDir(new URL(`${dir}/`, ROOT))) {
      if (entry.isDirectory) await walk(`${dir}/${entry.name}`);
      if (!entry.isFile || !entry.name.endsWith(".ts")) continue;
      const text = await Deno.readTextFile(new URL(`${dir}/${entry.name}`, ROOT));
      for (
        const m of text.matchAll(/new Worker\(\s*new URL\("\.\/([^"]+)", import\.meta\.url\)/g)
      ) {
        workers.push(`${dir}/${m[1]}`);
      }
    }
  };
  for (const dir of ["cli", "client", "http", "options", "protocol", "router", "server"]) {
    await walk(dir);
  }
  assert.ok(workers.includes("protocol/hash_thread_worker.ts"), String(workers));
  for (const worker of workers) {
    assert.ok(includes.includes(worker), `${worker} not in: ${command}`);
  }
  assert.match(command, / cli\.ts$/);
});
