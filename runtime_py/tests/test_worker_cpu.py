"""Programs through a real CPU-mode zygote and child, over the frame protocol."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def child(cpu_zygote):
    """One reused CPU child for the tests of this module."""
    handle = cpu_zygote.child(max_requests=0)
    yield handle
    handle.kill()


def test_hello_and_ready(cpu_zygote, child) -> None:
    hello = cpu_zygote.hello
    assert hello["t"] == "hello" and hello["mode"] == "cpu"
    assert hello["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(hello["pid"], int) and "torch" not in hello["versions"]
    assert child.ready == {"c": child.c, "child": True, "t": "ready", "target": {}, "versions": hello["versions"],
                           "device_uuids": []}


def test_cpu_zygote_never_imports_torch(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("import sys\ndef main():\n    return 'torch' in sys.modules\n")))
    assert r.results == {"r": {"type": "boolean", "value": False}}


def test_preloaded_modules_are_in_every_child(make_request, child, kc) -> None:
    """--preload imports the named modules in the zygote: a child starts with them (torch on a
    CPU server that runs kcoral eval); the reported versions stay as upstream's CPU mode."""
    from conftest import ZygoteProcess

    probe = kc.call("import sys\ndef main():\n    return 'xml.dom.minidom' in sys.modules\n")
    assert child.run(make_request(probe)).results == {"r": {"type": "boolean", "value": False}}
    zygote = ZygoteProcess("cpu", "--preload", "fractions,xml.dom.minidom")
    try:
        assert zygote.hello["t"] == "hello", zygote.stderr_text()
        assert zygote.hello["versions"] == child.ready["versions"]
        handle = zygote.child(max_requests=0)
        try:
            r = handle.run(make_request(probe))
            assert r.results == {"r": {"type": "boolean", "value": True}}, r.outcome
        finally:
            handle.kill()
    finally:
        zygote.close()


def test_a_module_that_cannot_be_preloaded_fails_the_start_naming_it() -> None:
    from conftest import ZygoteProcess

    zygote = ZygoteProcess("cpu", "--preload", "fractions,kcoral_no_such_module")
    try:
        assert zygote.hello["t"] == "error"
        assert "--preload-modules: importing 'kcoral_no_such_module' failed: " \
               "ModuleNotFoundError" in zygote.hello["message"]
    finally:
        zygote.close()


def test_scalar_program(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("def main(x):\n    return x + 1\n", "main", 41)))
    assert r.outcome["status"] == "COMPLETED" and r.outcome["error"] is None
    assert r.outcome["results"] == '{"r":{"type":"integer","value":42}}'
    assert r.outcome["parts"] == [] and r.outcome["gpu_access"] is None
    assert r.retire is None
    assert [f["t"] for f in r.frames] == ["outcome"]  # no lease frames at all on a CPU worker
    assert set(r.outcome) == {"status", "results", "error", "parts", "stdout", "stderr",
                              "gpu_access", "boundary"}
    boundary = r.outcome["boundary"]
    assert boundary.startswith("kcoral-") and len(boundary) == 39


def test_syntax_error_is_parse(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("def main(:\n")))
    error = r.outcome["error"]
    assert r.outcome["status"] == "FAILED"
    assert set(error) == {"kind", "message", "instruction_index", "instruction_op",
                          "instruction_id", "traceback"}
    assert error["kind"] == "parse" and error["message"].startswith("syntax error: ")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (0, "upload", "m")
    assert r.results == {}


def test_module_exception_is_parse_and_missing_name(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("raise KeyError('boom')\n")))
    assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == ("parse", "KeyError: 'boom'")
    r = child.run(make_request(kc.call("x = 1\n", "nope")))
    error = r.outcome["error"]
    assert (error["kind"], error["message"]) == ("parse", "the uploaded Python module defines no name 'nope'")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (1, "get_function", "f")


def test_user_exception_is_engine_with_traceback_tail(make_request, child, kc) -> None:
    source = (
        "def main():\n    deep(3)\n"
        "def deep(n):\n    if n == 0:\n        raise ValueError('bad') from KeyError('k' * 9000)\n"
        "    deep(n - 1)\n"
    )
    r = child.run(make_request(kc.call(source)))
    error = r.outcome["error"]
    assert (error["kind"], error["message"]) == ("engine", "ValueError: bad")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (2, "run", "r")
    assert len(error["traceback"]) == 8192  # the tail of a long traceback
    assert error["traceback"].endswith("ValueError: bad\n")
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    assert f'File "<uploaded:{digest}>", line 5, in deep' in error["traceback"]
    assert "raise ValueError('bad') from KeyError" in error["traceback"]  # seeded linecache
    assert error["traceback"].startswith("k" * 100)  # the head was cut, not the tail


def test_execution_error_kind_and_system_exit(make_request, child, kc) -> None:
    source = (
        "from kcoral_runtime.errors import ExecutionError\n"
        "def main():\n    raise ExecutionError('correctness', 'mismatch at 3')\n"
        "def leave():\n    raise SystemExit(3)\n"
    )
    r = child.run(make_request(kc.call(source)))
    assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == ("correctness", "mismatch at 3")
    r = child.run(make_request(kc.call(source, "leave")))
    assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == ("engine", "SystemExit: 3")


def test_unavailable_on_cpu(make_request, child, kc) -> None:
    """Tensor uploads and get_function on other handles are unavailable on CPU workers;
    library uploads are not (plain C ABI, tests/test_library_wiring.py)."""
    blob = make_request.blob(b"\0" * 16)
    cases = [
        ([kc.upload_blob("t", "tensor", blob, dtype="float32", shape=[4])],
         "tensor uploads require a GPU worker"),
        ([kc.upload_blob("b", "bytes", blob), kc.get_function("f", "b", "x")],
         "get_function expects an uploaded module or library handle"),
    ]
    for instructions, message in cases:
        r = child.run(make_request(instructions, blobs=[blob]))
        assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == ("unavailable", message)


def test_not_callable_and_argument_references(make_request, child, kc) -> None:
    blob = make_request.blob(b"raw\x00bytes")
    source = "value = 5\ndef echo(*args):\n    return [type(a).__name__ for a in args], args[1]\n"
    instructions = [
        kc.module("m", source),
        kc.upload_blob("b", "bytes", blob),
        kc.get_function("f", "m", "echo"),
        kc.run("r", "f", kc.ref("b"), [kc.ref("b")], {"$ref": "b", "x": 1}, "s", 2.5, None),
        kc.ret("r", "r"),
        kc.ret("raw", "b"),
        kc.get_function("v", "m", "value"),
        kc.run("bad", "v"),
    ]
    r = child.run(make_request(instructions, blobs=[blob]))
    error = r.outcome["error"]
    assert (error["kind"], error["message"]) == ("runtime", "handle 'v' is not callable")
    assert (error["instruction_index"], error["instruction_id"]) == (7, "bad")
    # top-level references are resolved; nested ones stay literal JSON values
    assert r.results["r"]["value"][0]["value"] == [
        {"type": "string", "value": n} for n in ("bytes", "list", "dict", "str", "float", "NoneType")
    ]
    assert r.results["r"]["value"][1] == {"type": "array", "value": [
        {"type": "object", "value": {"$ref": {"type": "string", "value": "b"}}}]}
    assert r.results["raw"] == {"type": "bytes", "part": "return:0", "sha256": sha(b"raw\x00bytes")}
    assert Path(r.outcome["parts"][0]["path"]).read_bytes() == b"raw\x00bytes"
    assert r.outcome["parts"][0] == {"path": r.outcome["parts"][0]["path"], "size": 9,
                                     "sha256": sha(b"raw\x00bytes")}


def test_cpu_only_runs_directly_on_cpu(make_request, child, kc) -> None:
    instructions = [kc.module("m", "def f():\n    return 'ok'\n"),
                    kc.get_function("f", "m", "f", cpu_only=True), kc.run("r", "f"), kc.ret("r", "r")]
    r = child.run(make_request(instructions))
    assert r.results == {"r": {"type": "string", "value": "ok"}}


def test_file_upload_and_returns_exact_json(make_request, child, kc) -> None:
    blob = make_request.blob(b"hello\n")
    source = (
        "import os\n"
        "def build(path):\n"
        "    os.makedirs('out/sub', exist_ok=True)\n"
        "    os.makedirs('out/empty/inner', exist_ok=True)\n"
        "    open('out/.hidden', 'wb').write(b'h')\n"
        "    open('out/sub/data.bin', 'wb').write(open(path, 'rb').read() * 2)\n"
        "    os.chdir('out')  # returns stay relative to the workspace root\n"
        "    return path\n"
    )
    instructions = [
        kc.upload_blob("in", "file", blob, path="./inputs//hello.txt"),
        kc.module("m", source),
        kc.get_function("f", "m", "build"),
        kc.run("p", "f", kc.ref("in")),
        kc.ret("p", "p"),
        kc.ret_path("copy", "file", kc.ref("in")),
        kc.ret_path("tree", "folder", "out"),
    ]
    r = child.run(make_request(instructions, blobs=[blob]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    hello = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert r.outcome["results"] == (
        '{"p":{"type":"string","value":"inputs/hello.txt"},'
        f'"copy":{{"type":"file","part":"return:0","sha256":"{hello}","size":6}},'
        '"tree":{"type":"folder","files":{'
        f'".hidden":{{"type":"file","part":"return:1","sha256":"{sha(b"h")}","size":1}},'
        f'"sub/data.bin":{{"type":"file","part":"return:2","sha256":"{sha(b"hello" + bytes([10]) + b"hello" + bytes([10]))}","size":12}}'
        '},"directories":["empty","empty/inner","sub"]}}'
    )
    assert [p["size"] for p in r.outcome["parts"]] == [6, 1, 12]
    assert [Path(p["path"]).name for p in r.outcome["parts"]] == ["part-0", "part-1", "part-2"]


def test_returns_survive_a_later_failure_and_failed_return_rolls_back(make_request, child, kc) -> None:
    source = "def f():\n    return [b'a', b'b', float('nan')]\ndef g():\n    return b'c'\n"
    instructions = [
        kc.module("m", source),
        kc.get_function("g", "m", "g"), kc.run("c", "g"), kc.ret("first", "c"),
        kc.get_function("f", "m", "f"), kc.run("bad", "f"), kc.ret("bad", "bad"),
        kc.ret("after", "c"),
    ]
    r = child.run(make_request(instructions))
    error = r.outcome["error"]
    assert (error["kind"], error["message"]) == ("serialization", "cannot return a non-finite number")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (6, "return", None)
    assert r.results == {"first": {"type": "bytes", "part": "return:0", "sha256": sha(b"c")}}
    assert len(r.outcome["parts"]) == 1
    assert sorted(os.listdir(Path(r.outcome["parts"][0]["path"]).parent)) == ["part-0", "stderr", "stdout"]


def test_failed_folder_return_rolls_back(make_request, child, kc) -> None:
    source = "import os\ndef f():\n    os.makedirs('d')\n    open('d/a', 'w').write('a')\n    os.symlink('/etc/passwd', 'd/z')\n"
    instructions = [kc.module("m", source), kc.get_function("f", "m", "f"), kc.run("r", "f"),
                    kc.ret_path("d", "folder", "d"), kc.ret_path("a", "file", "d/a")]
    r = child.run(make_request(instructions))
    error = r.outcome["error"]
    assert error["kind"] == "serialization"
    assert error["message"] == "cannot return folder: ValueError: file return rejects symbolic links and special files: 'z'"
    assert r.results == {} and r.outcome["parts"] == []


@pytest.mark.parametrize(
    "path, fragment",
    [("../x", "must not contain a '..' component"), ("/etc/passwd", "must be relative"),
     ("link/passwd", "Not a directory"), ("passwd-link", "Too many levels of symbolic links")],
)
def test_unsafe_return_paths(make_request, child, kc, tmp_path, path, fragment) -> None:
    work = tmp_path / "ws-unsafe"
    work.mkdir()
    (work / "link").symlink_to("/etc")
    (work / "passwd-link").symlink_to("/etc/passwd")
    r = child.run(make_request([kc.module("m", ""), kc.ret_path("x", "file", path)], workspace=work))
    error = r.outcome["error"]
    assert error["kind"] == "serialization" and error["message"].startswith("cannot return file: ")
    assert fragment in error["message"]


def test_unsafe_upload_paths(make_request, child, kc, tmp_path) -> None:
    blob = make_request.blob(b"x")
    work = tmp_path / "ws-upload"
    work.mkdir()
    (work / "link").symlink_to(tmp_path)
    for path in ("link/x", "../x"):
        r = child.run(make_request([kc.upload_blob("f", "file", blob, path=path)], blobs=[blob], workspace=work))
        error = r.outcome["error"]
        assert error["kind"] == "runtime" and error["message"].startswith(f"cannot materialize file {path!r}: ")
    assert not (tmp_path / "x").exists()


def test_output_capture_includes_c_level_and_subprocess(make_request, child, kc) -> None:
    source = (
        "import os, subprocess, sys\n"
        "def main():\n"
        "    print('from print é')\n"
        "    sys.stdout.flush()\n"
        "    os.write(1, b'from os.write\\n')\n"
        "    subprocess.run(['sh', '-c', 'echo from-subprocess; echo sub-err >&2'], check=True)\n"
        "    print('to stderr', file=sys.stderr)\n"
        "    sys.stdout.write('bad \\udc80 char\\n')\n"
    )
    r = child.run(make_request(kc.call(source)))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    out = kc.read_capture(r.outcome, "stdout")
    err = kc.read_capture(r.outcome, "stderr")
    assert out == "from print é\nfrom os.write\nfrom-subprocess\nbad ? char\n".encode()
    assert err == b"sub-err\nto stderr\n"
    assert r.outcome["stdout"]["path"].endswith("/stdout")
    # the capture ended with the request: a later request starts from empty files
    r = child.run(make_request(kc.call("def main():\n    pass\n")))
    assert kc.read_capture(r.outcome, "stdout") == b"" and kc.read_capture(r.outcome, "stderr") == b""


def test_output_limit_zero_disables_capture(make_request, child, kc) -> None:
    req = make_request(kc.call("import os\ndef main():\n    os.write(1, b'x')\n    print('y')\n"),
                       output_limit_bytes=0)
    r = child.run(req)
    assert r.outcome["status"] == "COMPLETED"
    assert r.outcome["stdout"] is None and r.outcome["stderr"] is None
    assert os.listdir(req["results"]) == []


def test_big_output_is_all_in_the_file(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("def main():\n    print('a' * 3000000)\n"), output_limit_bytes=8))
    assert r.outcome["stdout"]["size"] == 3000001  # the server keeps the head


LOUD = (
    "import os, time\n"
    "def main():\n"
    "    peak = 0\n"
    "    chunk = b'h' * 1024 + b'x' * ((1 << 20) - 1024)\n"
    "    for _ in range(256):\n"
    "        os.write(1, chunk)\n"
    "        peak = max(peak, os.fstat(1).st_blocks * 512)\n"
    "        time.sleep(0.004)\n"
    "    return peak\n"
)


def test_output_far_past_the_limit_does_not_fill_the_disk(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call(LOUD), output_limit_bytes=4096))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    # While it ran, the file was cut back (without the guard it held all 256 MiB; the bound
    # leaves room for a loaded machine), and what is left holds no more than the head + slack.
    peak = r.results["r"]["value"]
    assert peak < 160 << 20, peak
    info = r.outcome["stdout"]
    assert os.stat(info["path"]).st_blocks * 512 <= 4097 + (8 << 20) + (1 << 20)
    assert info["size"] == 256 << 20  # the length still says how much was written
    with open(info["path"], "rb") as f:
        assert f.read(4096) == b"h" * 1024 + b"x" * 3072  # the head the server returns


def test_capture_descriptors_the_program_reused_are_left_alone(make_request, child, kc, tmp_path) -> None:
    data = tmp_path / "mine.bin"
    source = (
        "import os\n"
        "def main():\n"
        "    results = os.path.dirname(os.path.realpath('/proc/self/fd/1'))\n"
        "    ours = [int(f) for f in os.listdir('/proc/self/fd') if int(f) > 2 and\n"
        "            os.path.realpath(f'/proc/self/fd/{f}').startswith(results + '/std')]\n"
        "    os.close(ours[0])\n"
        f"    mine = os.open({str(data)!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)\n"
        "    os.write(mine, b'x' * (10 << 20))\n"
        "    return [ours[0], mine]\n"
    )
    r = child.run(make_request(kc.call(source), output_limit_bytes=1000))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    capture_fd, mine = (item["value"] for item in r.results["r"]["value"])
    assert mine == capture_fd  # the program's file took the capture descriptor's number
    # Neither cut (the guard's last cut ran when the capture stopped) nor closed by the runtime.
    assert data.read_bytes().count(b"x") == 10 << 20
    check = f"import os\ndef main():\n    os.fstat({mine})\n    os.close({mine})\n"
    r = child.run(make_request(kc.call(check)))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]


def test_linecache_entry_removed_after_request(make_request, child, kc) -> None:
    source = "import linecache\ndef main():\n    return [k for k in linecache.cache if k.startswith('<uploaded:')]\n"
    r = child.run(make_request(kc.call(source)))
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    assert r.results["r"]["value"] == [{"type": "string", "value": f"<uploaded:{digest}>"}]
    r = child.run(make_request(kc.call(source + "# other\n")))
    assert len(r.results["r"]["value"]) == 1  # the first request's entry is gone


def test_workspace_is_cwd_and_cwd_restored(make_request, child, kc) -> None:
    source = "import os\ndef main():\n    here = os.getcwd()\n    os.chdir('/')\n    return here\n"
    req = make_request(kc.call(source))
    r = child.run(req)
    assert r.results["r"]["value"] == os.path.realpath(req["workspace"])
    r = child.run(make_request(kc.call("import os\ndef main():\n    return os.getcwd()\n")))
    assert r.results["r"]["value"] != "/"


def test_results_json_text_order_and_unicode(make_request, child, kc) -> None:
    source = "def main():\n    return {'b': 1, 'a': 'ü', '10': 2, '9': 3}\n"
    r = child.run(make_request(kc.call(source)))
    assert r.outcome["results"] == (
        '{"r":{"type":"object","value":{"b":{"type":"integer","value":1},'
        '"a":{"type":"string","value":"ü"},"10":{"type":"integer","value":2},'
        '"9":{"type":"integer","value":3}}}}'
    )
    assert json.loads(r.outcome["results"])["r"]["value"]["a"]["value"] == "ü"


def test_large_outcome_frame_is_relayed_intact(make_request, child, kc) -> None:
    r = child.run(make_request(kc.call("def main():\n    return 'é' * 3000000\n")))
    assert r.results["r"] == {"type": "string", "value": "é" * 3000000}
    # Results this large travel as a file beside the parts, not inside the frame.
    assert r.outcome["results"] is None and r.outcome["results_file"]["size"] > 6_000_000
