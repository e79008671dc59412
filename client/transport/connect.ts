/**
 * Opening a TCP connection within a time limit: the HTTP/1.1 transport's connections, and
 * the `fetch` transport's connect probe (`fetch` has no connect timeout of its own).
 *
 * @module
 */

/** A host and port to connect to. */
export interface Endpoint {
  /** Host name or IP address (an IPv6 address without brackets). */
  hostname: string;
  /** TCP port. */
  port: number;
}

/** An {@linkcode Endpoint} and how long a connection attempt may take. */
export interface ConnectTarget extends Endpoint {
  /** `null`: no limit. */
  connectTimeoutMs: number | null;
}

/** The connection could not be opened (the message names the host and the cause). */
export class ConnectError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ConnectError";
  }
}

const _REFUSED_RETRY_MS = 100;

/**
 * Opens a TCP connection to `target` within its `connectTimeoutMs` (a
 * {@linkcode ConnectError} naming the host otherwise); a refusal is tried once more after
 * 100 ms unless `retryRefused` is false. Aborting `abort` rejects with its reason.
 */
export async function connectTcp(
  target: ConnectTarget,
  abort?: AbortSignal,
  retryRefused = true,
): Promise<Deno.TcpConn> {
  const { hostname, port, connectTimeoutMs } = target;
  const timeout = connectTimeoutMs === null ? undefined : AbortSignal.timeout(connectTimeoutMs);
  const signal = abort && timeout ? AbortSignal.any([abort, timeout]) : abort ?? timeout;
  try {
    let conn: Deno.TcpConn;
    try {
      conn = await Deno.connect({ hostname, port, signal });
    } catch (error) {
      // A refusal can be momentary (a loaded or restarting server): one more try shortly.
      if (
        !retryRefused || !(error instanceof Deno.errors.ConnectionRefused) || signal?.aborted
      ) throw error;
      await new Promise((resolve) => setTimeout(resolve, _REFUSED_RETRY_MS));
      conn = await Deno.connect({ hostname, port, signal });
    }
    conn.setNoDelay(true);
    return conn;
  } catch (error) {
    abort?.throwIfAborted();
    if (timeout?.aborted) {
      throw new ConnectError(
        `timed out connecting to ${hostname}:${port} after ${connectTimeoutMs! / 1000} s`,
        { cause: error },
      );
    }
    throw new ConnectError(
      `cannot connect to ${hostname}:${port}: ${(error as Error).message}`,
      { cause: error },
    );
  }
}
