/**
 * Where the files of the Python worker runtime are read from when they are copied into the
 * user's cache (`server/runtime_cache.ts`): fetched from the URL of the package (a registry or
 * an HTTP server), or read with Deno's file APIs from a tree that Python cannot open itself, the
 * embedded file system of a `deno compile` binary. Every failure names the file, its URL and what
 * it was being read for.
 *
 * @module
 */

/** A place the runtime package's files can be read from. */
export interface RuntimeSource {
  /** The package directory's URL (with a trailing slash), named in errors. */
  readonly url: URL;
  /** The bytes of file `path` (`/`-separated, inside `kcoral_runtime/`). */
  read(path: string): Promise<Uint8Array>;
}

/** A runtime file that could not be read from its source. */
export class RuntimeSourceError extends Error {
  /** The file's path inside `kcoral_runtime/`. */
  readonly path: string;
  /** The file's URL. */
  readonly url: URL;

  /**
   * `path` at `url` could not be read, for `reason`.
   *
   * @example
   * ```ts
   * import { RuntimeSourceError } from "./runtime_sources.ts";
   *
   * const error = new RuntimeSourceError("tools/ncu.py", new URL("https://h/rt/tools/ncu.py"), "HTTP 404");
   * if (!error.message.includes("tools/ncu.py") || !error.message.includes("https://h/rt/")) {
   *   throw new Error();
   * }
   * ```
   */
  constructor(path: string, url: URL, reason: string) {
    const verb = url.protocol === "file:" ? "read" : "fetch";
    super(`cannot ${verb} the KCoral Python runtime (file ${path}) from ${url}: ${reason}`);
    this.name = "RuntimeSourceError";
    this.path = path;
    this.url = url;
  }
}

/**
 * Files fetched from `packageUrl` (`http:`, `https:`, or anything `fetch` reads). A network
 * error and an HTTP error status alike become a {@linkcode RuntimeSourceError}.
 *
 * @example
 * ```ts
 * import { fetchedSource, RuntimeSourceError } from "./runtime_sources.ts";
 *
 * const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) =>
 *   new URL(request.url).pathname === "/rt/a.py" ? new Response("x = 1\n") : new Response("", { status: 404 }));
 * const source = fetchedSource(new URL(`http://127.0.0.1:${server.addr.port}/rt/`));
 * if (new TextDecoder().decode(await source.read("a.py")) !== "x = 1\n") throw new Error();
 * const missing = await source.read("b.py").catch((e) => e);
 * if (!(missing instanceof RuntimeSourceError) || !missing.message.endsWith("HTTP 404 Not Found")) {
 *   throw new Error(String(missing));
 * }
 * await server.shutdown();
 * ```
 */
export function fetchedSource(packageUrl: URL): RuntimeSource {
  return {
    url: packageUrl,
    async read(path) {
      const url = new URL(path, packageUrl);
      let response: Response;
      try {
        response = await fetch(url);
      } catch (error) {
        throw new RuntimeSourceError(path, url, _reason(error));
      }
      if (!response.ok) {
        await response.body?.cancel();
        throw new RuntimeSourceError(
          path,
          url,
          `HTTP ${response.status} ${response.statusText}`.trimEnd(),
        );
      }
      try {
        return new Uint8Array(await response.arrayBuffer());
      } catch (error) {
        throw new RuntimeSourceError(path, url, _reason(error));
      }
    },
  };
}

/**
 * Files read with `Deno.readFile` under the `file:` URL `packageUrl`: the embedded file system
 * of a `deno compile` binary, which only this process can read (Python cannot open its paths).
 *
 * @example
 * ```ts
 * import { embeddedSource } from "./runtime_sources.ts";
 *
 * const source = embeddedSource(new URL("../runtime_py/kcoral_runtime/", import.meta.url));
 * const zygote = new TextDecoder().decode(await source.read("zygote.py"));
 * if (!zygote.includes("def ")) throw new Error();
 * ```
 */
export function embeddedSource(packageUrl: URL): RuntimeSource {
  if (packageUrl.protocol !== "file:") {
    throw new TypeError(`an embedded runtime is read from a file: URL, not ${packageUrl}`);
  }
  return {
    url: packageUrl,
    async read(path) {
      const url = new URL(path, packageUrl);
      try {
        return await Deno.readFile(url);
      } catch (error) {
        throw new RuntimeSourceError(path, url, _reason(error));
      }
    },
  };
}

function _reason(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  // fetch's TypeError says only "fetch failed"-like text; its cause has the network error.
  const cause = (error as { cause?: unknown }).cause;
  return cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
}
