/**
 * The runtime manifest matches the package, a cached copy of it runs, and `deno task compile`
 * embeds what the compiled binary reads at run time.
 */
import assert from "node:assert/strict";
import { computeManifest, RUNTIME_MANIFEST } from "../server/runtime_manifest.ts";
import { runtimePythonPath } from "../server/runtime_files.ts";

const PACKAGE = new URL("../runtime_py/kcoral_runtime/", import.meta.url);
const ROOT = new URL("../", import.meta.url);

Deno.test("runtime files: the manifest names exactly the package's Python files and their hashes", async () => {
  const actual = await computeManifest(PACKAGE);
  assert.deepEqual(
    actual,
    RUNTIME_MANIFEST,
    "runtime_py/runtime_manifest.json is out of date: run `deno task runtime-manifest`",
  );
});

Deno.test("runtime files: a copy extracted into the cache is importable by Python", async () => {
  const cacheDir = await Deno.makeTempDir();
  try {
    // `standalone`: as a compiled binary, whose embedded tree Python cannot open itself.
    const path = await runtimePythonPath({ standalone: true, cacheDir });
    assert.equal(path, `${cacheDir}/runtime/${RUNTIME_MANIFEST.hash}`);
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

Deno.test("runtime files: `deno task compile` embeds the runtime and every worker module", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  const command: string = config.tasks.compile.command;
  const includes = [...command.matchAll(/--include (\S+)/g)].map((m) => m[1]);
  assert.ok(includes.includes("runtime_py/kcoral_runtime/"), command);
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
