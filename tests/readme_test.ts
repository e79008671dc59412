/**
 * The README as a newcomer meets it: its first lines are the quickstart and the test command (the
 * one CI runs), the quickstart installs nothing and says what it lacks, `deno task -q kcoral` works
 * from any directory, the TypeScript example runs with the client's narrow permission, every
 * `jsr:` command line carries the unstable flag a checkout's deno.json sets, and every file the
 * README links to is published with the package.
 */
import assert from "node:assert/strict";
import { startServer } from "./_server.ts";

const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname);
const README = await Deno.readTextFile(`${ROOT}README.md`);
const CONFIG = JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));

/** The fenced code blocks of a Markdown text, with their language. */
function codeBlocks(markdown: string): { lang: string; text: string }[] {
  return [...markdown.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({
    lang: m[1],
    text: m[2],
  }));
}

async function run(args: string[], options: { cwd?: string; env?: Record<string, string> } = {}) {
  // As from a fresh shell: no INIT_CWD inherited from an npm/npx or deno task that started the
  // tests (`deno task` keeps an INIT_CWD it finds, as npm does).
  const env: Record<string, string> = { ...Deno.env.toObject(), NO_COLOR: "1", ...options.env };
  delete env.INIT_CWD;
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: options.cwd ?? ROOT,
    clearEnv: true,
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return { code: output.code, stdout: text(output.stdout), stderr: text(output.stderr) };
}

Deno.test("readme: the first lines are the quickstart and the test command CI runs", async () => {
  const first = codeBlocks(README)[0];
  assert.ok(README.indexOf("```sh") < 40, "the commands open the README");
  const commands = first.text.split("\n").filter((line) => line.trim() !== "")
    .map((line) => line.replace(/\s+#.*$/, "").trim());
  assert.deepEqual(commands, [
    "npx -y deno@2.9.6 task -q quickstart",
    "npx -y deno@2.9.6 task test",
  ]);
  const ci = await Deno.readTextFile(`${ROOT}.ci/run`);
  assert.ok(ci.split("\n").includes(commands[1]), ".ci/run runs the README's test command");
});

Deno.test("readme: the quickstart depends on no setup and names what it lacks", async () => {
  const quickstart = CONFIG.tasks.quickstart;
  assert.equal(quickstart.dependencies, undefined, "quickstart must not run setup");
  assert.doesNotMatch(quickstart.command, /setup|apt-get|pip/);
  const dir = await Deno.makeTempDir({ prefix: "kcoral-readme-" });
  try {
    const python = `${dir}/python-without-numpy`;
    await Deno.writeTextFile(python, "#!/bin/sh\nexit 1\n", { mode: 0o755 });
    const lacking = await run(["task", "-q", "quickstart"], { env: { KCORAL_PYTHON: python } });
    assert.equal(lacking.code, 1, lacking.stderr);
    assert.match(lacking.stderr, /has no numpy/);
    assert.match(lacking.stderr, /pip install numpy/);
    assert.doesNotMatch(lacking.stderr, /^Task /m, "-q hides deno task's own line");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  const ran = await run(["task", "-q", "quickstart"]);
  assert.equal(ran.code, 0, ran.stderr);
  assert.match(ran.stdout, /Output: \[2, 3, 4, 5\]/);
});

Deno.test("readme: deno task -q kcoral resolves --send where it is typed, not in the checkout", async () => {
  const server = await startServer();
  const dir = await Deno.makeTempDir({ prefix: "kcoral-readme-" });
  try {
    await Deno.mkdir(`${dir}/experiment`);
    await Deno.writeTextFile(
      `${dir}/experiment/check.py`,
      "import os\nprint(sorted(os.listdir('.')))\n",
    );
    const result = await run(
      [
        "task",
        "-q",
        "--config",
        `${ROOT}deno.json`,
        "kcoral",
        "run",
        "python",
        "--url",
        server.url,
        "--send",
        ".",
        "--",
        `${dir.slice(dir.lastIndexOf("/") + 1)}/experiment/check.py`,
      ],
      { cwd: dir },
    );
    assert.equal(result.code, 0, result.stderr);
    // `.` is the directory it was typed in (its name), not the checkout.
    assert.equal(result.stdout, `['${dir.slice(dir.lastIndexOf("/") + 1)}']\n`);
    assert.equal(result.stderr, "");
  } finally {
    await server.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("readme: the TypeScript example runs with --allow-net=HOST:PORT alone", async () => {
  const block = codeBlocks(README).find((b) => b.lang === "ts");
  assert.ok(block, "a ts example");
  assert.match(block.text, /from "jsr:@kcoral\/cli\/client"/, "the example imports the client");
  const server = await startServer();
  const dir = await Deno.makeTempDir({ prefix: "kcoral-readme-" });
  try {
    const source = block.text
      .replace('"jsr:@kcoral/cli/client"', JSON.stringify(`${ROOT}client/mod.ts`))
      .replace('"http://127.0.0.1:8000"', JSON.stringify(server.url));
    await Deno.writeTextFile(`${dir}/example.ts`, source);
    const host = new URL(server.url).host;
    const result = await run(["run", `--allow-net=${host}`, `${dir}/example.ts`], { cwd: dir });
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, /^42 [\d.]+ [\d.]+\n$/);
  } finally {
    await server.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("readme: every jsr: command line carries --unstable-no-legacy-abort", async () => {
  const files = [`${ROOT}README.md`];
  for (const dir of ["docs", "examples/kubernetes", "examples/systemd"]) {
    for await (const entry of Deno.readDir(`${ROOT}${dir}`)) {
      if (entry.isFile && entry.name.endsWith(".md")) files.push(`${ROOT}${dir}/${entry.name}`);
    }
  }
  let checked = 0;
  for (const file of files) {
    for (const block of codeBlocks(await Deno.readTextFile(file))) {
      if (!block.text.includes("jsr:@kcoral/cli")) continue;
      if (!/deno (run|install|compile)|"run",/.test(block.text)) continue;
      checked++;
      // Each command (a JSON args array or a shell line with its continuations) has the flag.
      const commands = block.text.replace(/\\\n/g, " ").split(
        /\n(?=\S)|\n\s*"mcpServers"|"servers"/,
      );
      for (const command of commands.filter((c) => c.includes("jsr:@kcoral/cli"))) {
        assert.match(command, /--unstable-no-legacy-abort/, `${file}: ${command.slice(0, 160)}`);
      }
    }
  }
  assert.ok(checked >= 4, `only ${checked} blocks checked`);
});

Deno.test("readme: every file it links to exists and is published; the pictures are there", async () => {
  const include: string[] = CONFIG.publish.include;
  const links = [...README.matchAll(/\]\(((?!https?:|#)[^)#\s]+)(#[^)]*)?\)/g)].map((m) => m[1]);
  assert.ok(links.includes("docs/architecture.svg") && links.includes("docs/status-server.png"));
  for (const link of links) {
    await Deno.stat(`${ROOT}${link}`);
    assert.ok(
      include.some((entry) => link === entry || (entry.endsWith("/") && link.startsWith(entry))),
      `${link} is not in deno.json's publish.include`,
    );
  }
  const parsed = await new Deno.Command("python3", {
    args: [
      "-c",
      "import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); " +
      "print(r.tag, r.find('{http://www.w3.org/2000/svg}title') is not None)",
      `${ROOT}docs/architecture.svg`,
    ],
    stdout: "piped",
  }).output();
  assert.equal(
    new TextDecoder().decode(parsed.stdout).trim(),
    "{http://www.w3.org/2000/svg}svg True",
  );
});
