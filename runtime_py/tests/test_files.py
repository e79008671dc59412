"""Unit tests of path rules, file materialization and file/folder collection."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from kcoral_runtime import files
from kcoral_runtime.errors import ExecutionError, ValidationError
from kcoral_runtime.paths import normalize_file_path
from kcoral_runtime.values import Results


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "raw, expected",
    [("a", "a"), ("./data//x.bin", "data/x.bin"), ("a/./b/", "a/b"), (".hidden", ".hidden"),
     ("é/ü", "é/ü")],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize_file_path(raw) == expected


@pytest.mark.parametrize(
    "raw, message",
    [
        ("", "filesystem 'path' must be a non-empty string"),
        (3, "filesystem 'path' must be a non-empty string"),
        ("a\x00b", "filesystem 'path' must not contain NUL"),
        ("a\\b", "filesystem 'path' must use POSIX '/' separators"),
        ("/etc/passwd", "filesystem 'path' must be relative"),
        ("a/../b", "filesystem 'path' must not contain a '..' component"),
        ("..", "filesystem 'path' must not contain a '..' component"),
        ("././/", "filesystem 'path' must name a file or folder"),
        ("x" * 256, "filesystem 'path' contains a component longer than 255 bytes"),
        ("/".join(["x" * 200] * 21), "filesystem 'path' is longer than 4096 bytes"),
    ],
)
def test_normalize_rejects(raw: object, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_file_path(raw)
    assert str(info.value) == message


@pytest.fixture
def blob(tmp_path: Path):
    def make(data: bytes) -> str:
        path = tmp_path / f"blob-{sha(data)}"
        path.write_bytes(data)
        return str(path)

    return make


def test_materialize_creates_private_dirs_and_file(tmp_path: Path, blob) -> None:
    work = tmp_path / "work"
    work.mkdir()
    data = os.urandom(3 << 20)
    assert files.materialize_file(str(work), "./a//b/c.bin", blob(data), sandbox=False) == "a/b/c.bin"
    assert (work / "a/b/c.bin").read_bytes() == data
    assert stat.S_IMODE((work / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((work / "a/b").stat().st_mode) == 0o700
    assert stat.S_IMODE((work / "a/b/c.bin").stat().st_mode) == 0o600
    # An existing parent directory is fine; an existing file is not (O_EXCL).
    files.materialize_file(str(work), "a/other", blob(b"x"), sandbox=False)
    with pytest.raises(ExecutionError) as info:
        files.materialize_file(str(work), "a/other", blob(b"y"), sandbox=False)
    assert info.value.kind == "runtime"
    assert info.value.message.startswith("cannot materialize file 'a/other': FileExistsError")
    assert (work / "a/other").read_bytes() == b"x"


def test_materialize_never_follows_symlinks(tmp_path: Path, blob) -> None:
    work = tmp_path / "work"
    outside = tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "dir").symlink_to(outside)
    (work / "file").symlink_to(outside / "target")
    for path in ("dir/x", "file"):
        with pytest.raises(ExecutionError) as info:
            files.materialize_file(str(work), path, blob(b"data"), sandbox=False)
        assert info.value.kind == "runtime"
        assert info.value.message.startswith(f"cannot materialize file {path!r}: ")
    assert list(outside.iterdir()) == []


def test_materialize_validates_paths_again(tmp_path: Path, blob) -> None:
    with pytest.raises(ExecutionError) as info:
        files.materialize_file(str(tmp_path), "../escape", blob(b"d"), sandbox=False)
    assert info.value.message == (
        "cannot materialize file '../escape': ValidationError: "
        "filesystem 'path' must not contain a '..' component"
    )
    assert not (tmp_path.parent / "escape").exists()


def test_materialize_reserved_dir_only_in_sandbox(tmp_path: Path, blob) -> None:
    with pytest.raises(ExecutionError) as info:
        files.materialize_file(str(tmp_path), "./.kcoral/x", blob(b"d"), sandbox=True)
    assert info.value.message == (
        "cannot materialize file '.kcoral/x': ValidationError: "
        "'.kcoral' is reserved for sandbox runtime files"
    )
    assert files.materialize_file(str(tmp_path), ".kcoral/x", blob(b"d"), sandbox=False) == ".kcoral/x"


def test_empty_blob(tmp_path: Path, blob) -> None:
    files.materialize_file(str(tmp_path), "empty", blob(b""), sandbox=False)
    assert (tmp_path / "empty").read_bytes() == b""


def make_tree(root: Path) -> None:
    (root / "out/sub/deeper").mkdir(parents=True)
    (root / "out/empty").mkdir()
    (root / "out/.hidden").write_bytes(b"h")
    (root / "out/b.txt").write_bytes(b"bee")
    (root / "out/a-b").write_bytes(b"dash")
    (root / "out/sub/x").write_bytes(b"xx")
    (root / "out/sub/deeper/y").write_bytes(b"")


def collect(res: Results, work: Path, path: object, kind: str, budget: int = 1 << 30):
    return files.collect(res.store, str(work), path, kind, budget)


def test_collect_folder_sorted_with_hidden_and_empty_dirs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    make_tree(work)
    res = Results(str(tmp_path / "res"), None)
    (tmp_path / "res").mkdir()
    res.return_value("first", b"0")
    res.add("f", lambda: collect(res, work, "out", "folder"))
    node = json.loads(res.text())["f"]
    # sorted by code point: ".hidden" < "a-b" < "b.txt" < "sub/deeper/y" < "sub/x"
    assert node == {
        "type": "folder",
        "files": {
            ".hidden": {"type": "file", "part": "return:1", "sha256": sha(b"h"), "size": 1},
            "a-b": {"type": "file", "part": "return:2", "sha256": sha(b"dash"), "size": 4},
            "b.txt": {"type": "file", "part": "return:3", "sha256": sha(b"bee"), "size": 3},
            "sub/deeper/y": {"type": "file", "part": "return:4", "sha256": sha(b""), "size": 0},
            "sub/x": {"type": "file", "part": "return:5", "sha256": sha(b"xx"), "size": 2},
        },
        "directories": ["empty", "sub", "sub/deeper"],
    }
    assert [Path(p.path).read_bytes() for p in res.store.parts] == [b"0", b"h", b"dash", b"bee", b"", b"xx"]
    assert sorted(os.listdir(tmp_path / "res")) == [f"part-{i}" for i in range(6)]


def test_collect_empty_folder_and_file(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "d").mkdir(parents=True)
    (work / "d/hello").write_bytes(b"hello\n")
    res = Results(str(tmp_path), None)
    (work / "e").mkdir()
    assert collect(res, work, "e", "folder") == {"type": "folder", "files": {}, "directories": []}
    assert collect(res, work, "./d//hello", "file") == {
        "type": "file", "part": "return:0",
        "sha256": "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", "size": 6,
    }


@pytest.mark.parametrize(
    "setup, path, kind, fragment",
    [
        (lambda w: (w / "link").symlink_to(w / "real"), "link", "file", "Too many levels"),
        (lambda w: (w / "dlink").symlink_to(w), "dlink/real", "file", "Not a directory"),
        (lambda w: (w / "f/l").symlink_to(w / "real"), "f", "folder",
         "rejects symbolic links and special files: 'l'"),
        (lambda w: os.mkfifo(w / "f/fifo"), "f", "folder", "special files: 'fifo'"),
        (lambda w: os.mkfifo(w / "fifo"), "fifo", "file", "requires a regular file: 'fifo'"),
        (lambda w: None, "f", "file", "requires a regular file: 'f'"),
        (lambda w: None, "real", "folder", "Not a directory"),
        (lambda w: None, "missing", "file", "No such file"),
        (lambda w: None, "a/../real", "file", "must not contain a '..' component"),
        (lambda w: None, 7, "file", "must be a non-empty string"),
    ],
)
def test_collect_rejects(tmp_path: Path, setup, path, kind, fragment) -> None:
    work = tmp_path / "work"
    (work / "f").mkdir(parents=True)
    (work / "f/ok").write_bytes(b"ok")
    (work / "real").write_bytes(b"real")
    setup(work)
    res_dir = tmp_path / "res"
    res_dir.mkdir()
    res = Results(str(res_dir), None)
    with pytest.raises(Exception) as info:
        res.add("k", lambda: collect(res, work, path, kind))
    assert fragment in str(info.value)
    assert res.store.parts == [] and os.listdir(res_dir) == []


def test_collect_budget(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "d").mkdir(parents=True)
    (work / "d/a").write_bytes(b"12345")
    (work / "d/b").write_bytes(b"678")
    res = Results(str(tmp_path), None)
    assert collect(res, work, "d", "folder", budget=8)["files"]["b"]["size"] == 3
    with pytest.raises(ValueError) as info:
        res.add("k", lambda: collect(res, work, "d", "folder", budget=7))
    assert str(info.value) == "file return exceeds max_response_bytes binary budget"
    assert len(res.store.parts) == 2


def test_collect_repeated_directory_via_bind_is_detected(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    (work / "d/sub").mkdir(parents=True)
    real_fstat = os.fstat
    first = {}

    def fake_fstat(fd: int):
        info = real_fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            key = first.setdefault("key", (info.st_dev, info.st_ino))
            return os.stat_result((info.st_mode, key[1], key[0]) + tuple(info)[3:])
        return info

    monkeypatch.setattr(files.os, "fstat", fake_fstat)
    res = Results(str(tmp_path), None)
    with pytest.raises(ValueError) as info:
        collect(res, work, "d", "folder")
    assert str(info.value) == "file return encountered a repeated directory"


def test_file_changing_while_read_is_rejected(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "f").write_bytes(b"abc")
    res = Results(str(tmp_path / "res"), None)
    (tmp_path / "res").mkdir()
    real = res.store.stage_from_fd

    def grow_while_reading(fd: int, nbytes: int):
        out = real(fd, nbytes)
        with open(work / "f", "ab") as f:
            f.write(b"more")
        return out

    monkeypatch.setattr(res.store, "stage_from_fd", grow_while_reading)
    with pytest.raises(ValueError) as info:
        res.add("k", lambda: collect(res, work, "f", "file"))
    assert str(info.value) == "file changed while reading: 'f'"
    assert os.listdir(tmp_path / "res") == []
