/** The runtime file list matches the package, and a copy of it runs a zygote. */
import assert from "node:assert/strict";
import { materializeRuntime, RUNTIME_FILES } from "../server/runtime_files.ts";

const PACKAGE = new URL("../runtime_py/kcoral_runtime/", import.meta.url);

function _walk(dir: string, prefix = ""): string[] {
  const out: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    if (entry.name === "__pycache__") continue;
    if (entry.isDirectory) out.push(..._walk(`${dir}/${entry.name}`, `${prefix}${entry.name}/`));
    else if (entry.name.endsWith(".py")) out.push(`${prefix}${entry.name}`);
  }
  return out;
}

Deno.test("runtime files: the list names exactly the package's Python files", () => {
  assert.deepEqual([...RUNTIME_FILES].sort(), _walk(PACKAGE.pathname).sort());
});

Deno.test("runtime files: a materialized copy is importable and starts a CPU zygote", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await materializeRuntime(PACKAGE, `${dir}/kcoral_runtime`);
    const output = await new Deno.Command("python3", {
      args: ["-c", "import kcoral_runtime.zygote, kcoral_runtime.tools.runner; print('ok')"],
      env: { PYTHONPATH: dir },
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(new TextDecoder().decode(output.stderr), "");
    assert.equal(new TextDecoder().decode(output.stdout).trim(), "ok");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
