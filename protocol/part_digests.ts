/**
 * SHA-256 of a multipart body's parts while the body arrives, so hashing overlaps the transfer; on
 * the server, blob payloads spooled to files meanwhile; and padding that 8-byte aligns the first
 * binary payload so a typed array can view it in place. Only an accelerator: the strict parser
 * decides what the parts are, and a digest is used only for a part whose exact byte range it
 * covers.
 *
 * @module
 */

import { createHash, type Hash } from "node:crypto";
import { DelimiterFinder } from "./bytes_search.ts";
import { boundaryFromContentType, delimiterMarkPattern } from "./multipart_parse.ts";
import type { HashSink } from "./hash_threads.ts";

const _ALIGN = 8;
/** The id of a thread hash that was lost with its thread (ids start at 1). */
const _LOST = -1;
const _latin1 = new TextDecoder("latin1");
const _HEADER_END = new DelimiterFinder(new Uint8Array([13, 10, 13, 10]));

/** Digests of part payloads by exact position, filled in as the body arrives. */
export class PartDigests {
  readonly #delimiter: DelimiterFinder;
  /** Finds `LF--boundary`: every occurrence is recorded (the parser reuses them). */
  readonly #markFinder: DelimiterFinder;
  readonly #marks: number[] = [];
  /** Marks are complete below this position. */
  #markedTo = 0;
  /** The first mark not yet looked at by the hashing state machine. */
  #markIndex = 0;
  #body: Uint8Array | null = null;
  #received = 0;
  /** Scan position of the header search. */
  #pos = 0;
  #contentStart = -1;
  #hashedTo = 0;
  /**
   * The payload being hashed: here (`Hash`) or on the thread (its id); `null` in headers;
   * {@linkcode _LOST} when the thread failed under it (that part is hashed at decoding).
   */
  #hash: Hash | number | null = null;
  readonly #thread: HashSink | undefined;
  /** Shared copy of the body the thread hashes from (reading then never waits for it). */
  readonly #mirror: SharedArrayBuffer | undefined;
  /** Bytes copied into the mirror so far. */
  #mirrored = 0;
  readonly #spool: ((partHeader: string) => string | undefined) | undefined;
  /** The payload being spooled: its spool on the threads, and the file. */
  #spooling: { id: number; path: string } | null = null;
  /** Payload key → its spool file and how many bytes it got. */
  readonly #spooled = new Map<string, { path: string; written: number }>();
  /** Spool files not taken over yet (deleted by discardSpooled). */
  readonly #unclaimed = new Set<string>();
  #threadFailed = false;
  readonly #digests = new Map<string, string>();
  readonly #pending: Promise<void>[] = [];

  private constructor(
    boundary: string,
    thread: HashSink | undefined,
    shared:
      | { mirror: SharedArrayBuffer; spool?: (partHeader: string) => string | undefined }
      | undefined,
  ) {
    this.#delimiter = new DelimiterFinder(new TextEncoder().encode(`\r\n--${boundary}`));
    this.#markFinder = new DelimiterFinder(delimiterMarkPattern(boundary));
    this.#thread = thread;
    this.#mirror = shared?.mirror;
    this.#spool = shared?.spool;
  }

  /**
   * An observer for a multipart body (request or response), or `undefined` for anything else. With
   * `thread`, payloads are hashed there while this thread keeps reading. With `shared.mirror`
   * (called once, for a buffer at least as long as the body), the bytes are also copied into shared
   * memory and hashed there, so reading never waits for a hashing thread (the buffer must not be
   * reused before {@linkcode settle} resolves); then `shared.spool` may name, from a part's header
   * text, a new file another thread writes that payload to while it is hashed (see
   * {@linkcode spooled} and {@linkcode discardSpooled}).
   */
  static forMultipart(
    headers: Headers,
    thread?: HashSink,
    shared?: {
      mirror: () => SharedArrayBuffer;
      spool?: (partHeader: string) => string | undefined;
    },
  ): PartDigests | undefined {
    const contentType = headers.get("content-type");
    const mediaType = (contentType ?? "").split(";", 1)[0].trim().toLowerCase();
    if (mediaType !== "multipart/form-data") return undefined;
    let boundary;
    try {
      boundary = boundaryFromContentType(contentType);
    } catch {
      return undefined;
    }
    return new PartDigests(
      boundary,
      thread,
      thread && shared ? { mirror: shared.mirror(), spool: shared.spool } : undefined,
    );
  }

  /** Resolves once every digest begun has been computed (call before {@linkcode lookup}). */
  async settle(): Promise<void> {
    await Promise.all(this.#pending);
  }

  /** Padding that 8-byte aligns the payload of the second part (the first binary one). */
  pad(prefix: Uint8Array): number {
    const second = this.#delimiter.find(prefix, 0);
    if (second < 0) return 0;
    const headerEnd = _HEADER_END.find(prefix, second + this.#delimiter.pattern.length);
    if (headerEnd < 0) return 0;
    const payload = headerEnd + 4;
    return (_ALIGN - (payload % _ALIGN)) % _ALIGN;
  }

  /** Scans and hashes `body[.., received)` (resolves once the bytes are handed on). */
  async update(body: Uint8Array, received: number): Promise<void> {
    // The same bytes may come in a new view each time (a BYOB reader transfers its buffer).
    this.#body = body;
    let view = body.subarray(0, Math.min(received, body.length));
    this.#received = view.length;
    if (this.#mirror && view.length <= this.#mirror.byteLength) {
      const mirror = new Uint8Array(this.#mirror, 0, view.length);
      if (view.length > this.#mirrored) {
        mirror.set(view.subarray(this.#mirrored), this.#mirrored);
        this.#mirrored = view.length;
      }
      view = mirror; // the same bytes at the same positions: hashed where the thread reads them
    }
    // One scan of every new byte for `LF--boundary`.
    const markLength = this.#markFinder.pattern.length;
    for (let at = this.#markFinder.find(view, this.#markedTo); at >= 0;) {
      this.#marks.push(at);
      at = this.#markFinder.find(view, at + 1);
    }
    this.#markedTo = Math.max(this.#markedTo, view.length - markLength + 1);
    const delimiterLength = this.#delimiter.pattern.length; // CRLF--boundary
    for (;;) {
      if (this.#hash === null) {
        // Part headers: the payload starts after the first empty line.
        const at = _HEADER_END.find(view, this.#pos);
        if (at < 0) {
          this.#pos = Math.max(this.#pos, view.length - 3);
          return;
        }
        const headerStart = this.#pos;
        this.#contentStart = this.#hashedTo = this.#pos = at + 4;
        if (this.#thread && !this.#threadFailed) {
          this.#hash = this.#thread.open();
          // Spooled on another thread than the hash's, so writing never slows the hashing.
          const path = this.#spool?.(_latin1.decode(view.subarray(headerStart, at)));
          if (path !== undefined) {
            this.#spooling = { id: this.#thread.spool(path), path };
            this.#unclaimed.add(path);
          }
        } else {
          this.#hash = createHash("sha256");
        }
        continue;
      }
      // The payload ends at the first CRLF--boundary, i.e. a mark preceded by CR.
      let end = -1;
      while (this.#markIndex < this.#marks.length) {
        const mark = this.#marks[this.#markIndex];
        if (mark - 1 >= this.#hashedTo && view[mark - 1] === 13) {
          end = mark - 1;
          break;
        }
        this.#markIndex++;
      }
      if (end >= 0) {
        await this.#feed(view.subarray(this.#hashedTo, end));
        this.#finish(`${this.#contentStart}:${end}`);
        this.#pos = end + delimiterLength;
        this.#markIndex++;
        continue;
      }
      const safe = Math.max(this.#hashedTo, view.length - delimiterLength + 1);
      if (safe > this.#hashedTo) {
        await this.#feed(view.subarray(this.#hashedTo, safe));
        this.#hashedTo = safe;
      }
      this.#pos = safe;
      return;
    }
  }

  /**
   * Every position of `LF--boundary` in `body` if the whole of it was seen here (for
   * `parseMultipart`'s `marks`), else `undefined`.
   */
  marksFor(body: Uint8Array): readonly number[] | undefined {
    if (!this.#same(body) || this.#received !== body.length) return undefined;
    return this.#marks;
  }

  #same(body: Uint8Array): boolean {
    const seen = this.#body;
    return seen !== null && body.buffer === seen.buffer && body.byteOffset === seen.byteOffset &&
      body.length === seen.length;
  }

  async #feed(bytes: Uint8Array): Promise<void> {
    const spooling = this.#spooling;
    if (spooling) {
      // Shared bytes: posted, never waited for. A failure (the thread is gone) only loses the
      // file, which stays unclaimed and is deleted here later.
      await this.#thread!.update(spooling.id, bytes).catch(() => {
        this.#thread!.drop(spooling.id);
        this.#spooling = null;
      });
    }
    const hash = this.#hash!;
    if (hash === _LOST) return;
    if (typeof hash !== "number") {
      hash.update(bytes);
      return;
    }
    try {
      await this.#thread!.update(hash, bytes);
    } catch {
      // A failed thread only loses the shortcut: this part is hashed at decoding, later ones
      // here; the body itself is still read.
      this.#threadFailed = true;
      this.#hash = _LOST;
    }
  }

  #finish(key: string): void {
    const spooling = this.#spooling;
    this.#spooling = null;
    if (spooling) {
      this.#pending.push(
        this.#thread!.written(spooling.id).then((written) => {
          if (written !== null) this.#spooled.set(key, { path: spooling.path, written });
        }, () => {}),
      );
    }
    const hash = this.#hash!;
    this.#hash = null;
    if (hash === _LOST) return;
    if (typeof hash !== "number") {
      this.#digests.set(key, hash.digest("hex"));
      return;
    }
    // A failed thread only loses the shortcut: the part is then hashed at decoding.
    this.#pending.push(
      this.#thread!.digest(hash).then((hex) => void this.#digests.set(key, hex), () => {}),
    );
  }

  /**
   * The file the hashing thread wrote with exactly the bytes of `part` (if it asked for one and the
   * part is exactly a payload seen here); the caller takes it over (after {@linkcode settle}).
   */
  spooled(part: Uint8Array): string | undefined {
    const key = this.#key(part);
    const file = key === undefined ? undefined : this.#spooled.get(key);
    if (!file || file.written !== part.length || !this.#unclaimed.has(file.path)) return undefined;
    this.#unclaimed.delete(file.path);
    return file.path;
  }

  /**
   * Deletes every spool file nobody took (call when the body is done with; a payload still being
   * hashed or spooled — of a body given up while arriving, or one whose last part never ended — is
   * dropped, with its file). Resolves `true` when no thread can still read the body (nothing was
   * dropped on a live thread): only then may a shared mirror be reused.
   */
  async discardSpooled(): Promise<boolean> {
    let idle = true;
    const open = this.#hash;
    if (typeof open === "number" && open !== _LOST) {
      this.#hash = _LOST;
      if (this.#thread!.drop(open)) idle = false;
    }
    const spooling = this.#spooling;
    if (spooling) {
      this.#spooling = null;
      // A live thread deletes the file itself, after its last write; a dead one writes no more,
      // so the file is deleted here with the other unclaimed ones.
      if (this.#thread!.drop(spooling.id)) {
        idle = false;
        this.#unclaimed.delete(spooling.path);
      }
    }
    await this.settle();
    const paths = [...this.#unclaimed];
    this.#unclaimed.clear();
    await Promise.all(paths.map((path) => Deno.remove(path).catch(() => {})));
    return idle;
  }

  #key(part: Uint8Array): string | undefined {
    const body = this.#body;
    if (body === null || part.buffer !== body.buffer) return undefined;
    const start = part.byteOffset - body.byteOffset;
    return `${start}:${start + part.byteLength}`;
  }

  /** The digest of `part` if it is exactly a payload seen here (else `undefined`). */
  lookup(part: Uint8Array): string | undefined {
    const key = this.#key(part);
    return key === undefined ? undefined : this.#digests.get(key);
  }
}
