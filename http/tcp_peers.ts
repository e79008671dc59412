/**
 * Which clients are still connected to a local port, as the kernel sees it (Linux
 * `/proc/net/tcp` and `/proc/net/tcp6`): for a listener served by `Deno.serve`, whose request
 * `signal` tells of a closed connection only for requests of up to 512 bytes
 * (bench/probes/client_gone_signal.ts). A client that closed its end leaves the server's socket
 * in `CLOSE_WAIT`, one that reset it leaves none; only `ESTABLISHED` ones count as present.
 *
 * @module
 */

const _ESTABLISHED = "01";

/**
 * The remote ports of the `ESTABLISHED` TCP connections whose local port is `localPort`, or
 * `null` where the kernel's tables cannot be read (not Linux). Keyed by port alone: two clients
 * on different hosts with the same port count as one, present while either is (the safe side).
 *
 * @example
 * ```ts
 * import { establishedPeerPorts } from "./tcp_peers.ts";
 *
 * const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
 * const client = await Deno.connect({ hostname: "127.0.0.1", port: listener.addr.port });
 * const server = await listener.accept();
 * const peers = establishedPeerPorts(listener.addr.port);
 * if (peers !== null && !peers.has(client.localAddr.port)) throw new Error("not seen");
 * client.close();
 * server.close();
 * listener.close();
 * ```
 */
export function establishedPeerPorts(localPort: number): Set<number> | null {
  const ports = new Set<number>();
  let read = false;
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = Deno.readTextFileSync(table);
    } catch {
      continue;
    }
    read = true;
    for (const line of text.split("\n")) {
      // "  sl  local_address rem_address   st ..." : address fields end with ":PORT" in hex.
      const fields = line.trim().split(/\s+/);
      if (fields.length < 4 || fields[3] !== _ESTABLISHED) continue;
      const local = fields[1];
      if (parseInt(local.slice(local.lastIndexOf(":") + 1), 16) !== localPort) continue;
      const remote = fields[2];
      ports.add(parseInt(remote.slice(remote.lastIndexOf(":") + 1), 16));
    }
  }
  return read ? ports : null;
}
