/**
 * The `kcoral` command: dispatches on its first argument (`run`, `server`, `router`) before any
 * parsing, as upstream does, so each sub-command owns its own syntax.
 *
 * @module
 */

const _HELP = `usage: kcoral [-h] {server,router,run} ...

KCoral remote execution.

positional arguments:
  {server,router,run}
    server      start a standalone server or join a Router
    router      route requests across compute nodes
    run         run a tool on a remote server

options:
  -h, --help    show this help message and exit`;

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
  if (command === undefined || command === "-h" || command === "--help") {
    console.log(_HELP);
    return 0;
  }
  console.error(_HELP.split("\n")[0]);
  console.error(
    command.startsWith("-")
      ? `kcoral: error: unrecognized arguments: ${command}`
      : `kcoral: error: argument command: invalid choice: '${command}' (choose from 'server', 'router', 'run')`,
  );
  return 2;
}
