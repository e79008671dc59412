/**
 * A minimal deterministic tar writer (POSIX ustar headers, PAX extended headers when a
 * name or size does not fit), for the `--send` archive. Every field except name, mode,
 * size and contents is fixed: mtime 0, uid/gid 0, empty user and group names, so the same
 * files always give the same bytes (and the same blob hash on the server).
 *
 * @module
 */

/** One regular file of a tar archive. */
export interface TarFile {
  /** Member name: a relative POSIX path. */
  name: string;
  /** File contents. */
  data: Uint8Array;
  /** Permission bits of the member, e.g. `0o700`. */
  mode: number;
}

const _BLOCK = 512;
const _RECORD = 20 * _BLOCK;
const _MAX_OCTAL_SIZE = 0o77777777777; // 11 octal digits
const _encoder = new TextEncoder();

/**
 * Write `files`, in order, as an uncompressed tar archive. The archive ends with two zero
 * blocks and is padded to a multiple of 10240 bytes, like Python's `tarfile` and GNU tar;
 * with no files it is 10240 zero bytes, which both read as an empty archive.
 *
 * Names longer than 100 bytes or not pure ASCII are stored in a PAX `path` record, sizes
 * beyond 8 GiB in a PAX `size` record.
 *
 * @example
 * ```ts
 * import { writeTar } from "./tar.ts";
 * const tar = writeTar([{ name: "a.txt", data: new TextEncoder().encode("hi"), mode: 0o600 }]);
 * tar.length; // 10240
 * ```
 */
export function writeTar(files: readonly TarFile[]): Uint8Array {
  const chunks: Uint8Array[] = [];
  for (const file of files) {
    const records: [string, string][] = [];
    const name = _encoder.encode(file.name);
    // deno-lint-ignore no-control-regex
    if (name.length > 100 || !/^[\x00-\x7f]*$/.test(file.name)) records.push(["path", file.name]);
    if (file.data.length > _MAX_OCTAL_SIZE) records.push(["size", String(file.data.length)]);
    if (records.length > 0) {
      const payload = _encoder.encode(records.map(_paxRecord).join(""));
      chunks.push(_header("././@PaxHeader", 0, payload.length, "x"), ..._padded(payload));
    }
    const size = file.data.length > _MAX_OCTAL_SIZE ? 0 : file.data.length;
    chunks.push(_header(_fallbackName(file.name), file.mode & 0o7777, size, "0"));
    chunks.push(..._padded(file.data));
  }
  const length = chunks.reduce((total, chunk) => total + chunk.length, 0) + 2 * _BLOCK;
  const archive = new Uint8Array(Math.ceil(length / _RECORD) * _RECORD);
  let offset = 0;
  for (const chunk of chunks) {
    archive.set(chunk, offset);
    offset += chunk.length;
  }
  return archive;
}

// A PAX record "LEN KEY=VALUE\n", where LEN counts the whole record in bytes.
function _paxRecord([key, value]: [string, string]): string {
  const body = ` ${key}=${value}\n`;
  const bodyLength = _encoder.encode(body).length;
  let length = bodyLength + 1;
  while (String(length).length + bodyLength !== length) length += 1;
  return `${length}${body}`;
}

// The ustar name of a member whose real name is in a PAX record: ASCII ("?" for others)
// and at most 100 bytes, like Python's tarfile.
function _fallbackName(name: string): string {
  return Array.from(name, (char) => char.charCodeAt(0) < 0x80 ? char : "?").join("").slice(0, 100);
}

function _header(name: string, mode: number, size: number, type: string): Uint8Array {
  const header = new Uint8Array(_BLOCK);
  const put = (offset: number, text: string) => header.set(_encoder.encode(text), offset);
  const octal = (value: number, width: number) => value.toString(8).padStart(width - 1, "0") + "\0";
  put(0, name); // name[100]
  put(100, octal(mode, 8)); // mode
  put(108, octal(0, 8)); // uid
  put(116, octal(0, 8)); // gid
  put(124, octal(size, 12)); // size
  put(136, octal(0, 12)); // mtime
  put(148, "        "); // checksum, counted as spaces
  put(156, type); // typeflag
  put(257, "ustar\x0000"); // magic and version
  // uname, gname, devmajor, devminor and prefix stay NUL, as Python's tarfile writes them.
  const checksum = header.reduce((total, byte) => total + byte, 0);
  put(148, checksum.toString(8).padStart(6, "0") + "\0 ");
  return header;
}

function _padded(data: Uint8Array): Uint8Array[] {
  const rest = data.length % _BLOCK;
  return rest === 0 ? [data] : [data, new Uint8Array(_BLOCK - rest)];
}
