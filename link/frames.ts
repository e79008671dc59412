/**
 * The node link's binary frames: one kind of frame carries a request's or an answer's head, its
 * body bytes and its end, in any combination, so a small exchange is one frame each way and a
 * large body is a head followed by frames of bytes (link/messages.ts has the text messages).
 * No I/O here.
 *
 * ```
 *  byte 0        flags: FRAME_HEAD (0x01) a head follows the id; FRAME_END (0x02) the sender's
 *                body ends with this frame; no other bit is set
 *  bytes 1–36    the request id (the Router's, 36 ASCII characters)
 *  FRAME_HEAD:   4 bytes, big-endian: the head's length n; then n bytes: the head as JSON
 *                (a RequestHead from the Router, a ResponseHead from the node)
 *  the rest      body bytes, at most MAX_DATA_BYTES
 * ```
 *
 * A frame carries at least one of the three. Only a frame with body bytes takes credit
 * (link/body_sender.ts); a head's JSON is at most {@linkcode MAX_TEXT_BYTES}.
 *
 * @module
 */
import { decodeUtf8 } from "../protocol/utf8.ts";
import {
  encodeMessage,
  LinkMessageError,
  MAX_DATA_BYTES,
  MAX_TEXT_BYTES,
  parseRequestHead,
  parseResponseHead,
  type RequestHead,
  type ResponseHead,
} from "./messages.ts";

/** The flag of a frame that carries a head. */
const _HEAD = 1;
/** The flag of a frame that ends its body. */
const _END = 2;
/** The flags and the request id: the header of a frame without a head. */
const _ID_END = 37;
/** The header of a frame with a head, before the head's JSON. */
const _HEAD_AT = 41;

/** The longest frame either end accepts: a head of {@linkcode MAX_TEXT_BYTES} and a full body. */
export const MAX_FRAME_BYTES = _HEAD_AT + MAX_TEXT_BYTES + MAX_DATA_BYTES;

const _UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const _utf8 = new TextEncoder();

/** A decoded frame. */
export interface BodyFrame<Head> {
  /** The request it belongs to. */
  requestId: string;
  /** The head it begins with, or `null`. */
  head: Head | null;
  /** Its body bytes (a view into the frame; may be empty). */
  bytes: Uint8Array;
  /** Whether the sender's body ends with it. */
  end: boolean;
}

/**
 * A frame's header with room for `payload` body bytes after it (zeroed, at the frame's end): its
 * flags, the request id and, when `head` is given (its JSON as UTF-8), the head. Fill the body in
 * place and send the header and the bytes filled as one message, with {@linkcode markEnd} when it
 * ends the body.
 */
export function frameWithRoom(
  requestId: string,
  head: Uint8Array | null,
  payload: number,
): Uint8Array<ArrayBuffer> {
  const header = head === null ? _ID_END : _HEAD_AT + head.length;
  const frame = new Uint8Array(header + payload);
  for (let i = 0; i < 36; i++) frame[1 + i] = requestId.charCodeAt(i);
  if (head !== null) {
    frame[0] = _HEAD;
    new DataView(frame.buffer).setUint32(_ID_END, head.length);
    frame.set(head, _HEAD_AT);
  }
  return frame;
}

/** Marks `frame` (its header) as the end of its body. */
export function markEnd(frame: Uint8Array): void {
  frame[0] |= _END;
}

/**
 * One frame in one buffer: `head` (or none), `bytes` (at most {@linkcode MAX_DATA_BYTES}) and,
 * with `end`, the end of the body.
 */
export function encodeFrame(
  requestId: string,
  head: RequestHead | ResponseHead | null,
  bytes: Uint8Array,
  end: boolean,
): Uint8Array<ArrayBuffer> {
  if (bytes.length > MAX_DATA_BYTES) {
    throw new RangeError(`a frame carries at most ${MAX_DATA_BYTES} bytes of body`);
  }
  const text = head === null ? null : _utf8.encode(encodeMessage(head));
  const frame = frameWithRoom(requestId, text, bytes.length);
  frame.set(bytes, frame.length - bytes.length);
  if (end) markEnd(frame);
  return frame;
}

/**
 * Reads a frame from the Router: its head, if any, is a request head. Throws
 * {@linkcode LinkMessageError} for a frame that is not one (which frame may come when is the
 * connection's state machine's to check).
 */
export function decodeRequestFrame(frame: Uint8Array): BodyFrame<RequestHead> {
  return _decode(frame, parseRequestHead);
}

/**
 * Reads a frame from a node: its head, if any, is a response head. Throws
 * {@linkcode LinkMessageError} for a frame that is not one.
 */
export function decodeResponseFrame(frame: Uint8Array): BodyFrame<ResponseHead> {
  return _decode(frame, parseResponseHead);
}

function _decode<Head>(frame: Uint8Array, parseHead: (text: string) => Head): BodyFrame<Head> {
  const flags = frame[0];
  if (frame.length < _ID_END || (flags & ~(_HEAD | _END)) !== 0) {
    throw new LinkMessageError("malformed frame");
  }
  // `apply` takes the bytes as they are, where a spread walks an iterator (about 1.2 µs a frame).
  const requestId = String.fromCharCode.apply(null, frame.subarray(1, _ID_END) as never);
  if (!_UUID.test(requestId)) throw new LinkMessageError("frame without a request id");
  let head: Head | null = null;
  let at = _ID_END;
  if ((flags & _HEAD) !== 0) {
    const length = frame.length < _HEAD_AT
      ? -1
      : new DataView(frame.buffer, frame.byteOffset, frame.length).getUint32(_ID_END);
    if (length < 0 || length > MAX_TEXT_BYTES || _HEAD_AT + length > frame.length) {
      throw new LinkMessageError("frame with a malformed head length");
    }
    let text: string;
    try {
      text = decodeUtf8(frame.subarray(_HEAD_AT, _HEAD_AT + length));
    } catch {
      throw new LinkMessageError("frame head is not UTF-8");
    }
    head = parseHead(text);
    at = _HEAD_AT + length;
  }
  const bytes = frame.subarray(at);
  if (bytes.length > MAX_DATA_BYTES) {
    throw new LinkMessageError(`frame body over ${MAX_DATA_BYTES} bytes`);
  }
  const end = (flags & _END) !== 0;
  if (head === null && bytes.length === 0 && !end) throw new LinkMessageError("empty frame");
  return { requestId, head, bytes, end };
}
