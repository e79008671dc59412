/**
 * Snapshot a local directory for Program.uploadFolder (spec protocol §5.2):
 * regular files only, hidden files included, symbolic links and special files
 * rejected, a directory seen twice rejected, files changing while read
 * rejected. Deno has no openat/O_NOFOLLOW, so links are detected with lstat
 * and every opened file is checked to be the entry that was lstat'ed.
 *
 * @module
 */

import { ValidationError } from "./errors.ts";
import { workspacePath } from "./uploads.ts";

function _sameFile(a: Deno.FileInfo, b: Deno.FileInfo): boolean {
  return a.dev === b.dev && a.ino === b.ino;
}

function _readSnapshot(local: string, remote: string, info: Deno.FileInfo): Uint8Array {
  const file = Deno.openSync(local, { read: true });
  try {
    const before = file.statSync();
    if (!before.isFile || !_sameFile(before, info)) {
      throw new ValidationError(`upload_folder requires a regular file: ${remote}`);
    }
    const data = new Uint8Array(before.size);
    let offset = 0;
    while (offset < data.length) {
      const n = file.readSync(data.subarray(offset));
      if (n === null) break;
      offset += n;
    }
    const after = file.statSync();
    if (
      offset !== before.size || after.size !== before.size ||
      after.mtime?.getTime() !== before.mtime?.getTime() ||
      after.ctime?.getTime() !== before.ctime?.getTime()
    ) {
      throw new ValidationError(`upload_folder file changed while reading: ${remote}`);
    }
    return data;
  } finally {
    file.close();
  }
}

/**
 * Regular files under `folder` as `[remote path, bytes]`, remote paths being
 * `destination/<relative path>` (normalized). Order is unspecified.
 */
export function folderFiles(folder: string, destination: string): [string, Uint8Array][] {
  const root = Deno.lstatSync(folder);
  if (root.isSymlink) throw new ValidationError(`upload_folder rejects symbolic links: ${folder}`);
  if (!root.isDirectory) throw new Deno.errors.NotADirectory(`not a directory: ${folder}`);
  const seen = new Set<string>();
  const files: [string, Uint8Array][] = [];
  const stack: [string, string, Deno.FileInfo][] = [[folder, destination, root]];
  while (stack.length > 0) {
    const [local, remote, info] = stack.pop()!;
    const identity = `${info.dev}:${info.ino}`;
    if (seen.has(identity)) {
      throw new ValidationError(`upload_folder encountered a repeated directory: ${remote}`);
    }
    seen.add(identity);
    for (const entry of Deno.readDirSync(local)) {
      const childLocal = `${local}/${entry.name}`;
      const childRemote = workspacePath(`${remote}/${entry.name}`);
      const childInfo = Deno.lstatSync(childLocal);
      if (childInfo.isDirectory) stack.push([childLocal, childRemote, childInfo]);
      else if (childInfo.isFile) {
        files.push([childRemote, _readSnapshot(childLocal, childRemote, childInfo)]);
      } else {
        throw new ValidationError(
          `upload_folder rejects symbolic links and special files: ${childRemote}`,
        );
      }
    }
  }
  return files;
}
