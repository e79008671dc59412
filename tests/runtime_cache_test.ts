/**
 * The Python runtime's copy in the user's cache: made once from a package served over HTTP and
 * reused with the server gone, errors that name the URL and the file, a tampered source, a
 * damaged copy, two starts at once, and the extraction a compiled binary does.
 */
import assert from "node:assert/strict";
import { cachedRuntime, RuntimeCacheError, RuntimeHashError } from "../server/runtime_cache.ts";
import { runtimePythonPath } from "../server/runtime_files.ts";
import { RUNTIME_MANIFEST } from "../server/runtime_manifest.ts";
import { fetchedSource, RuntimeSourceError } from "../server/runtime_sources.ts";

const PACKAGE = new URL("../runtime_py/kcoral_runtime/", import.meta.url);
const MANIFEST = RUNTIME_MANIFEST;

/**
 * Serves the runtime package's files under `/rt/` on 127.0.0.1; `edit` may answer a path
 * otherwise. `requests` counts the files asked for.
 */
function servePackage(edit: (path: string) => Response | null = () => null) {
  let requests = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const path = new URL(request.url).pathname.replace(/^\/rt\//, "");
    requests++;
    const edited = edit(path);
    if (edited) return edited;
    try {
      return new Response(await Deno.readFile(new URL(path, PACKAGE)));
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return {
    url: new URL(`http://127.0.0.1:${server.addr.port}/rt/`),
    get requests() {
      return requests;
    },
    stop: () => server.shutdown(),
  };
}

async function withCache(body: (cacheDir: string) => Promise<void>): Promise<void> {
  const cacheDir = await Deno.makeTempDir({ prefix: "kcoral-cache-test-" });
  try {
    await body(cacheDir);
  } finally {
    await Deno.remove(cacheDir, { recursive: true });
  }
}

async function entries(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

Deno.test("runtime cache: made once from an HTTP URL, then used with the server stopped", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage();
    const source = fetchedSource(served.url);
    const made = await cachedRuntime({ cacheDir, manifest: MANIFEST, source });
    assert.equal(made.how, "made");
    assert.equal(made.pythonPath, `${cacheDir}/runtime/${MANIFEST.hash}`);
    assert.equal(served.requests, Object.keys(MANIFEST.files).length);
    for (const path of Object.keys(MANIFEST.files)) {
      assert.deepEqual(
        await Deno.readFile(`${made.pythonPath}/kcoral_runtime/${path}`),
        await Deno.readFile(new URL(path, PACKAGE)),
      );
    }
    await served.stop();
    const again = await cachedRuntime({ cacheDir, manifest: MANIFEST, source });
    assert.deepEqual(again, { pythonPath: made.pythonPath, how: "cached" });
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [MANIFEST.hash], "no leftovers");
  });
});

Deno.test("runtime cache: with no server and no copy, the error names the URL and the file", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage();
    await served.stop();
    const error = await cachedRuntime({
      cacheDir,
      manifest: { hash: MANIFEST.hash, files: { "tools/ncu.py": MANIFEST.files["tools/ncu.py"] } },
      source: fetchedSource(served.url),
    }).catch((e) => e);
    assert.ok(error instanceof RuntimeCacheError, String(error));
    assert.ok(error.cause instanceof RuntimeSourceError);
    const url = new URL("tools/ncu.py", served.url);
    assert.ok(
      error.message.startsWith(
        `cannot fetch the KCoral Python runtime (file tools/ncu.py) from ${url}: `,
      ),
      error.message,
    );
    assert.ok(
      error.message.endsWith(`; no cached copy under ${cacheDir}/runtime/${MANIFEST.hash}`),
      error.message,
    );
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [], "the temporary copy is removed");
  });
});

Deno.test("runtime cache: an HTTP error status names the URL, the file and the status", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage((path) =>
      path === "cabi.py" ? new Response("gone", { status: 410 }) : null
    );
    try {
      const error = await cachedRuntime({
        cacheDir,
        manifest: MANIFEST,
        source: fetchedSource(served.url),
      }).catch((e) => e);
      assert.ok(error instanceof RuntimeCacheError, String(error));
      assert.equal(
        error.message,
        `cannot fetch the KCoral Python runtime (file cabi.py) from ${served.url}cabi.py: ` +
          `HTTP 410 Gone; no cached copy under ${cacheDir}/runtime/${MANIFEST.hash}`,
      );
      assert.deepEqual(await entries(`${cacheDir}/runtime`), []);
    } finally {
      await served.stop();
    }
  });
});

Deno.test("runtime cache: a served file that differs from the manifest is refused", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage((path) => path === "ipc.py" ? new Response("import os\n") : null);
    try {
      const error = await cachedRuntime({
        cacheDir,
        manifest: MANIFEST,
        source: fetchedSource(served.url),
      }).catch((e) => e);
      assert.ok(error instanceof RuntimeCacheError, String(error));
      assert.ok(error.cause instanceof RuntimeHashError);
      assert.match(
        error.message,
        new RegExp(
          `^the KCoral Python runtime file ipc\\.py from ${served.url}ipc\\.py has SHA-256 ` +
            `[0-9a-f]{64}, not ${MANIFEST.files["ipc.py"]} as this version's manifest says`,
        ),
      );
      assert.deepEqual(await entries(`${cacheDir}/runtime`), [], "nothing of it is kept");
    } finally {
      await served.stop();
    }
  });
});

Deno.test("runtime cache: a damaged copy is made anew, or named when the source is gone", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage();
    const source = fetchedSource(served.url);
    const { pythonPath } = await cachedRuntime({ cacheDir, manifest: MANIFEST, source });
    const ncu = `${pythonPath}/kcoral_runtime/tools/ncu.py`;
    await Deno.writeTextFile(ncu, "# edited\n", { append: true });
    const remade = await cachedRuntime({ cacheDir, manifest: MANIFEST, source });
    assert.deepEqual(remade, {
      pythonPath,
      how: "made",
      replaced: "file tools/ncu.py has another SHA-256",
    });
    assert.deepEqual(
      await Deno.readFile(ncu),
      await Deno.readFile(new URL("tools/ncu.py", PACKAGE)),
    );
    await served.stop();
    await Deno.remove(`${pythonPath}/kcoral_runtime/zygote.py`);
    const error = await cachedRuntime({ cacheDir, manifest: MANIFEST, source }).catch((e) => e);
    assert.ok(error instanceof RuntimeCacheError, String(error));
    assert.match(error.message, /^cannot fetch the KCoral Python runtime \(file [^)]+\) from http/);
    assert.match(
      error.message,
      new RegExp(`; the cached copy under ${pythonPath} is damaged \\(file zygote\\.py: `),
    );
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [], "the damaged copy is moved away");
  });
});

Deno.test("runtime cache: two starts at once both get one whole copy", async () => {
  await withCache(async (cacheDir) => {
    const served = servePackage();
    try {
      const source = fetchedSource(served.url);
      const [a, b] = await Promise.all([
        cachedRuntime({ cacheDir, manifest: MANIFEST, source }),
        cachedRuntime({ cacheDir, manifest: MANIFEST, source }),
      ]);
      assert.equal(a.pythonPath, b.pythonPath);
      assert.deepEqual(await entries(`${cacheDir}/runtime`), [MANIFEST.hash]);
      const again = await cachedRuntime({ cacheDir, manifest: MANIFEST, source });
      assert.equal(again.how, "cached");
    } finally {
      await served.stop();
    }
  });
});

Deno.test("runtime cache: temporary copies a crashed start left behind are removed after an hour", async () => {
  await withCache(async (cacheDir) => {
    await Deno.mkdir(`${cacheDir}/runtime/.tmp-old/kcoral_runtime`, { recursive: true });
    await Deno.mkdir(`${cacheDir}/runtime/.tmp-new`, { recursive: true });
    const hourAgo = new Date(Date.now() - 2 * 3600_000);
    await Deno.utime(`${cacheDir}/runtime/.tmp-old`, hourAgo, hourAgo);
    const served = servePackage();
    try {
      await cachedRuntime({ cacheDir, manifest: MANIFEST, source: fetchedSource(served.url) });
    } finally {
      await served.stop();
    }
    assert.deepEqual(await entries(`${cacheDir}/runtime`), [".tmp-new", MANIFEST.hash]);
  });
});

Deno.test("runtime cache: a compiled binary's embedded tree is extracted, then no longer read", async () => {
  // The tree at `embedded` stands for the binary's embedded file system: only Deno's file APIs
  // read it there (Python never gets its path), as they do in a `deno compile` binary.
  await withCache(async (cacheDir) => {
    const embedded = await Deno.makeTempDir({ prefix: "deno-compile-kcoral-" });
    for (const path of Object.keys(MANIFEST.files)) {
      const target = `${embedded}/kcoral_runtime/${path}`;
      await Deno.mkdir(target.slice(0, target.lastIndexOf("/")), { recursive: true });
      await Deno.copyFile(new URL(path, PACKAGE), target);
    }
    const packageUrl = new URL(`file://${embedded}/kcoral_runtime/`);
    const path = await runtimePythonPath({ packageUrl, standalone: true, cacheDir });
    assert.equal(path, `${cacheDir}/runtime/${MANIFEST.hash}`);
    assert.ok(!path.startsWith(embedded));
    await Deno.remove(embedded, { recursive: true });
    // Started again: the cached copy serves, the embedded tree is not read.
    assert.equal(await runtimePythonPath({ packageUrl, standalone: true, cacheDir }), path);
    // Not compiled: a checkout's directory is used in place, never copied.
    assert.equal(
      await runtimePythonPath({ packageUrl: PACKAGE, standalone: false, cacheDir: "/nonexistent" }),
      decodeURIComponent(new URL("..", PACKAGE).pathname).replace(/\/$/, ""),
    );
  });
});
