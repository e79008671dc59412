/**
 * `kcoral router`: one address for a pool of compute nodes (seed 003). Parses the Router's
 * option table (router/options.ts), serves the Router (router/app.ts) until SIGTERM/SIGINT.
 *
 * ```sh
 * kcoral router --host 127.0.0.1 --port 9000
 * ```
 *
 * @module
 */
import { CommandLineError } from "../options/command.ts";
import { pinMallocThresholds } from "./malloc_thresholds.ts";
import { connectionLimits } from "../http/connection_options.ts";
import { parseRouterCommandLine, RouterHelp, routerUsage } from "../router/options.ts";

/**
 * Runs `kcoral router ARGS`; resolves with the process exit status (0 after a clean stop, 1 for
 * an invalid setting or a port that cannot be bound, 2 for a malformed command line).
 *
 * @example
 * ```ts
 * import { routerMain } from "./router.ts";
 *
 * const quiet = console.error;
 * console.error = () => {};
 * const code = await routerMain(["--port", "65536"], {}); // invalid: exits 1 before listening
 * console.error = quiet;
 * if (code !== 1) throw new Error(String(code));
 * ```
 */
export async function routerMain(
  argv: string[],
  env: Record<string, string | undefined> = Deno.env.toObject(),
): Promise<number> {
  let config;
  let accessConfig;
  try {
    ({ config, access: accessConfig } = parseRouterCommandLine(argv, env));
  } catch (error) {
    if (error instanceof RouterHelp) {
      console.log(error.text);
      return 0;
    }
    if (error instanceof CommandLineError) {
      if (error.exitCode === 2) console.error(routerUsage().trimEnd());
      console.error(error.message);
      return error.exitCode;
    }
    throw error;
  }
  // Buffers freed per node-link message stay mapped for the next ones (cli/malloc_thresholds.ts).
  pinMallocThresholds(env);
  const { createRouter } = await import("../router/app.ts");
  const { serve } = await import("../http/serve.ts");
  const { consoleMessage } = await import("../http/events.ts");
  const { loadAccess, openBindWarning } = await import("../http/access_options.ts");
  let access;
  try {
    access = loadAccess(accessConfig);
  } catch (error) {
    console.error(`kcoral router: ${error instanceof Error ? error.message : error}`);
    return 1;
  }
  const open = openBindWarning(config.host, access.tokens, "kcoral router");
  if (open) console.error(open);
  const router = createRouter(config, { clientTokens: access.tokens });
  let running;
  try {
    running = await serve(router, {
      host: config.host,
      port: config.port,
      tls: access.tls,
      clientTokens: access.tokens,
      connections: connectionLimits(config),
      label: "KCoral router",
      onListen: (addr) => router.listening(addr),
      log: (line) => console.error(consoleMessage(config.logFormat, line, "router_console")),
    });
  } catch (error) {
    console.error(
      `kcoral router: cannot start the Router: ${error instanceof Error ? error.message : error}`,
    );
    return 1;
  }
  await running.finished;
  return 0;
}
