/**
 * The Python runtime's copy in the user's cache: written once from the module graph's texts and
 * reused, a damaged copy written anew, two starts at once, leftovers of crashed starts, and the
 * copy a compiled binary makes (Python never gets the embedded paths).
 */
import assert from "node:assert/strict";
import { cachedRuntime, RuntimeCacheError, userCacheDir } from "./runtime_cache.ts";
import { runtimePythonPath } from "./runtime_files.ts";
import { runtimeManifest } from "./runtime_manifest.ts";
import { readRuntimeFiles } from "../../runtime_py/runtime_files.ts";

const PACKAGE = new URL("../../runtime_py/kcoral_runtime/", import.meta.url);
const TEXTS = await readRuntimeFiles();
const HASH = runtimeManifest(TEXTS).hash;

async function withCache(body: (cacheDir: string) => Promise<void>): Promise<void> {
  const cacheDir = await Deno.makeTempDir({ prefix: "kcoral-cache-test-" });
  try {
    await body(cacheDir);
  } finally {
    await Deno.chmod(cacheDir, 0o755).catch(() => {});
    await Deno.remove(cacheDir, { recursive: true });
  }
}

async function entries(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

Deno.test("runtime cache: written once with the package's bytes, then reused as it is", async () => {
  await withCache(async (cacheDir) => {
    const made = await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.equal(made.how, "made");
    assert.equal(made.pythonPath, `${cacheDir}/runtime/${HASH}`);
    for (const path of TEXTS.keys()) {
      assert.deepEqual(
        await Deno.readFile(`${made.pythonPath}/kcoral_runtime/${path}`),
        await Deno.readFile(new URL(path, PACKAGE)),
      );
    }
    const again = await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.deepEqual(again, { pythonPath: made.pythonPath, how: "cached" });
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [HASH], "no leftovers");
  });
});

Deno.test("runtime cache: another version of the runtime gets its own directory", async () => {
  await withCache(async (cacheDir) => {
    const edited = new Map(TEXTS);
    edited.set("ipc.py", `${TEXTS.get("ipc.py")}# another version\n`);
    const a = await cachedRuntime({ cacheDir, texts: TEXTS });
    const b = await cachedRuntime({ cacheDir, texts: edited });
    assert.notEqual(a.pythonPath, b.pythonPath);
    assert.equal(b.how, "made");
    assert.equal((await entries(`${cacheDir}/runtime`)).length, 2);
  });
});

Deno.test("runtime cache: a damaged copy is written anew", async () => {
  await withCache(async (cacheDir) => {
    const { pythonPath } = await cachedRuntime({ cacheDir, texts: TEXTS });
    const ncu = `${pythonPath}/kcoral_runtime/tools/ncu.py`;
    await Deno.writeTextFile(ncu, "# edited\n", { append: true });
    const remade = await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.deepEqual(remade, {
      pythonPath,
      how: "made",
      replaced: "file tools/ncu.py has another SHA-256",
    });
    assert.deepEqual(
      await Deno.readFile(ncu),
      await Deno.readFile(new URL("tools/ncu.py", PACKAGE)),
    );
    await Deno.remove(`${pythonPath}/kcoral_runtime/zygote.py`);
    const again = await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.equal(again.how, "made");
    assert.match(again.replaced ?? "", /^file zygote\.py: /);
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [HASH], "the damaged copy is gone");
  });
});

Deno.test("runtime cache: an unwritable cache is named in the error", async () => {
  await withCache(async (cacheDir) => {
    if (Deno.uid() === 0) return; // root writes anywhere; nothing to check
    await Deno.chmod(cacheDir, 0o555);
    const error = await cachedRuntime({ cacheDir, texts: TEXTS }).catch((e) => e);
    assert.ok(error instanceof RuntimeCacheError, String(error));
    assert.match(error.message, new RegExp(`^cannot make the runtime cache ${cacheDir}/runtime`));
  });
});

Deno.test("runtime cache: two starts at once both get one whole copy", async () => {
  await withCache(async (cacheDir) => {
    const [a, b] = await Promise.all([
      cachedRuntime({ cacheDir, texts: TEXTS }),
      cachedRuntime({ cacheDir, texts: TEXTS }),
    ]);
    assert.equal(a.pythonPath, b.pythonPath);
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [HASH]);
    const again = await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.equal(again.how, "cached");
  });
});

Deno.test("runtime cache: temporary copies a crashed start left behind are removed after an hour", async () => {
  await withCache(async (cacheDir) => {
    await Deno.mkdir(`${cacheDir}/runtime/.tmp-old/kcoral_runtime`, { recursive: true });
    await Deno.mkdir(`${cacheDir}/runtime/.tmp-new`, { recursive: true });
    const hourAgo = new Date(Date.now() - 2 * 3600_000);
    await Deno.utime(`${cacheDir}/runtime/.tmp-old`, hourAgo, hourAgo);
    await cachedRuntime({ cacheDir, texts: TEXTS });
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [".tmp-new", HASH]);
  });
});

Deno.test("runtime cache: a compiled binary's runtime is written to the cache, a checkout's used in place", async () => {
  await withCache(async (cacheDir) => {
    // A `file:` package URL that does not exist stands for a binary's embedded file system: the
    // files come from the module graph's texts, never from that path.
    const packageUrl = new URL("file:///nonexistent/deno-compile-kcoral/kcoral_runtime/");
    const path = await runtimePythonPath({ packageUrl, standalone: true, cacheDir });
    assert.equal(path, `${cacheDir}/runtime/${HASH}`);
    assert.equal(await runtimePythonPath({ packageUrl, standalone: true, cacheDir }), path);
    const remote = new URL("https://jsr.example/@kcoral/cli/0.1.0/runtime_py/kcoral_runtime/");
    assert.equal(await runtimePythonPath({ packageUrl: remote, cacheDir }), path);
    assert.equal(
      await runtimePythonPath({ packageUrl: PACKAGE, standalone: false, cacheDir: "/nonexistent" }),
      decodeURIComponent(new URL("..", PACKAGE).pathname).replace(/\/$/, ""),
    );
  });
});

Deno.test("userCacheDir: KCORAL_CACHE_DIR, else XDG_CACHE_HOME, else HOME, absolute only", () => {
  assert.equal(userCacheDir({ KCORAL_CACHE_DIR: "/srv/kc/", HOME: "/h" }), "/srv/kc");
  assert.equal(userCacheDir({ XDG_CACHE_HOME: "/x", HOME: "/h" }), "/x/kcoral");
  assert.equal(userCacheDir({ XDG_CACHE_HOME: "rel", HOME: "/h" }), "/h/.cache/kcoral");
  assert.throws(() => userCacheDir({}), /KCORAL_CACHE_DIR/);
});
