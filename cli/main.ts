/**
 * The `kcoral` command: dispatches on its first argument (`run`, `server`, `router`, `health`,
 * `mcp`, `eval`) before any parsing, as upstream does, so each sub-command owns its own syntax.
 *
 * @module
 */
import { versionLine } from "../options/version.ts";

const _HELP = `usage: kcoral [-h] [--version] {server,router,run,health,mcp,eval} ...

KCoral remote execution.

positional arguments:
  {server,router,run,health,mcp,eval}
    server              start a standalone server or join a Router
    router              route requests across compute nodes
    run                 run a tool on a remote server
    health              show whether a server or Router is up, and its load
    mcp                 serve KCoral to agent hosts as MCP tools over stdio
    eval                judge a candidate kernel against a reference (split trust)

options:
  -h, --help            show this help message and exit
  --version             show program's version number and exit`;

/** Runs `kcoral ARGS`; resolves with the process exit status. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === "server") {
    const { serverMain } = await import("./server.ts");
    return await serverMain(rest);
  }
  if (command === "router") {
    const { routerMain } = await import("./router.ts");
    return await routerMain(rest);
  }
  if (command === "run") {
    const { runMain } = await import("./run/main.ts");
    return await runMain(rest);
  }
  if (command === "health") {
    const { healthMain } = await import("./health.ts");
    return await healthMain(rest);
  }
  if (command === "mcp") {
    const { mcpMain } = await import("./mcp/main.ts");
    return await mcpMain(rest);
  }
  if (command === "eval") {
    const { evalMain } = await import("./eval.ts");
    return await evalMain(rest);
  }
  if (command === "--version") {
    console.log(versionLine());
    return 0;
  }
  if (command === undefined || command === "-h" || command === "--help") {
    console.log(_HELP);
    return 0;
  }
  console.error(_HELP.split("\n")[0]);
  console.error(
    command.startsWith("-")
      ? `kcoral: error: unrecognized arguments: ${command}`
      : `kcoral: error: argument command: invalid choice: '${command}' (choose from 'server', 'router', 'run', 'health', 'mcp', 'eval')`,
  );
  return 2;
}
