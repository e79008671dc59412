/**
 * What the stages of a routed `POST /execute` (router/pipeline.ts) need of the Router.
 *
 * @module
 */
import type { EventLog } from "../http/events.ts";
import type { ClientWatch } from "./client_watch.ts";
import type { NodeRegistry } from "./registry.ts";

/** The Router's parts a routed request goes through. */
export interface ForwardContext {
  /** Nodes and their slots. */
  registry: NodeRegistry;
  /** The largest request body. */
  maxRequestBytes: number;
  /** Where `request_finished` goes. */
  events: EventLog;
  /** Called once the attempt has finished (answered, streamed, abandoned). */
  onFinished?: () => void;
  /** Notices a client that goes away while its request is on a node (default: not noticed). */
  clientWatch?: ClientWatch;
}
