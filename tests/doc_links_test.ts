/**
 * Every relative link in README.md and docs/ resolves: the file (or folder) exists, and a
 * `#fragment` names a heading of the target (GitHub's anchors: lower case, punctuation dropped,
 * spaces to hyphens, repeats numbered) or an `<a id="…">` in it.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);

/** The Markdown files whose links are checked, relative to the repository root. */
function documents(): string[] {
  const found = ["README.md"];
  const walk = (dir: string) => {
    for (const entry of Deno.readDirSync(new URL(dir, ROOT))) {
      const path = `${dir}${entry.name}`;
      if (entry.isDirectory) walk(`${path}/`);
      else if (entry.name.endsWith(".md")) found.push(path);
    }
  };
  walk("docs/");
  return found;
}

/** GitHub's anchors of a Markdown text's headings, and its HTML `id` anchors. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set([...text.matchAll(/<a id="([^"]+)"/g)].map((m) => m[1]));
  let fenced = false;
  for (const line of text.split("\n")) {
    if (line.startsWith("```")) fenced = !fenced;
    const heading = !fenced && line.match(/^#{1,6}\s+(.*)$/);
    if (!heading) continue;
    const base = heading[1].trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "")
      .replace(/\s/g, "-");
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    out.add(count === 0 ? base : `${base}-${count}`);
  }
  return out;
}

/** The relative link targets of a Markdown text, outside code (`[text](target)`). */
function links(text: string): string[] {
  const prose = text.replace(/```[\s\S]*?```/g, "").replace(/`[^`\n]*`/g, "");
  return [...prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1])
    .filter((target) => !/^[a-z][a-z0-9+.-]*:/i.test(target));
}

Deno.test("docs: every relative link in README.md and docs/ resolves", () => {
  const broken: string[] = [];
  let checked = 0;
  for (const doc of documents()) {
    const text = Deno.readTextFileSync(new URL(doc, ROOT));
    for (const target of links(text)) {
      checked++;
      const [path, fragment] = target.split("#", 2);
      const file = path === "" ? new URL(doc, ROOT) : new URL(path, new URL(doc, ROOT));
      let isFile: boolean;
      try {
        isFile = Deno.statSync(file).isFile;
      } catch {
        broken.push(`${doc}: ${target} (no such file)`);
        continue;
      }
      if (fragment && isFile && file.pathname.endsWith(".md")) {
        if (!anchors(Deno.readTextFileSync(file)).has(decodeURIComponent(fragment))) {
          broken.push(`${doc}: ${target} (no such heading)`);
        }
      }
    }
  }
  assert.ok(checked > 20, `only ${checked} links found: the link pattern is broken`);
  assert.deepEqual(broken, []);
});

Deno.test("docs: the link check finds a broken file and a broken heading", () => {
  // The helpers above on a text of our own, so the check itself can fail.
  const text = "# A title, with: punctuation\n## Twice\n## Twice\n```\n# not a heading\n```\n" +
    '- <a id="kept"></a>**Kept.**\n';
  assert.deepEqual([...anchors(text)], ["kept", "a-title-with-punctuation", "twice", "twice-1"]);
  assert.deepEqual(
    links('[a](x.md#y) `[b](code.md)` [c](https://example.org) [d](#local "t")'),
    ["x.md#y", "#local"],
  );
});
