import assert from "node:assert/strict";
import { type FileIdentity, FileSourceError, HashThreads } from "./hash_threads.ts";
import { sha256Hex } from "./hash.ts";

Deno.test("HashThreads.copyHashing: copies a file into a new one on a thread, with its SHA-256", async () => {
  const dir = await Deno.makeTempDir();
  const threads = new HashThreads(2);
  try {
    const bytes = new Uint8Array((9 << 20) + 17).map((_, i) => (i * 31) & 0xff);
    await Deno.writeFile(`${dir}/from`, bytes);
    const { ino, dev } = await Deno.stat(`${dir}/from`);
    const copies = await Promise.all(
      [0, 1, 2].map((k) =>
        threads.copyHashing(`${dir}/from`, `${dir}/to-${k}`, bytes.length, { ino, dev })
      ),
    );
    assert.deepEqual(copies, [0, 1, 2].map(() => sha256Hex(bytes)));
    assert.deepEqual(await Deno.readFile(`${dir}/to-2`), bytes);
    assert.equal((await Deno.stat(`${dir}/to-0`)).mode! & 0o777, 0o644);

    const refused = (
      to: string,
      size: number,
      identity: FileIdentity,
      message: RegExp,
      source = true,
    ) =>
      assert.rejects(
        () => threads.copyHashing(`${dir}/from`, `${dir}/${to}`, size, identity),
        (e: unknown) =>
          e instanceof Error && message.test(e.message) &&
          (e instanceof FileSourceError) === source,
      );
    await refused("a", bytes.length - 1, { ino, dev }, /has 9437201 bytes, not 9437200/);
    await refused(
      "b",
      bytes.length,
      { ino: (ino ?? 0) + 1, dev },
      /is not the file that was opened/,
    );
    // Never over another file: the server's problem, not the source's.
    await refused("to-0", bytes.length, { ino, dev }, /exists/i, false);
    // The same file under a new inode (replaced after it was checked): refused.
    await Deno.rename(`${dir}/from`, `${dir}/old`);
    await Deno.writeFile(`${dir}/from`, bytes);
    await refused("c", bytes.length, { ino, dev }, /is not the file that was opened/);
    // The thread goes on after a refusal.
    const again = await Deno.stat(`${dir}/from`);
    assert.equal(
      await threads.copyHashing(`${dir}/from`, `${dir}/d`, bytes.length, again),
      sha256Hex(bytes),
    );
  } finally {
    threads.close();
    await Deno.remove(dir, { recursive: true });
  }
});
