"""The inputs step's sets made side by side in forked processes (eval_inputs): the same bundle as
made one after another, every value kind carried, failures reported, no process left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, List

import pytest

torch = pytest.importorskip("torch")

from kcoral_runtime import eval_worker  # noqa: E402
from kcoral_runtime.errors import ExecutionError  # noqa: E402
from kcoral_runtime.eval_bundle import Bundle, BundleWriter  # noqa: E402
from kcoral_runtime.eval_inputs import describe_seeds  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "eval"
SEEDS = {"correctness_seeds": ["101", "202", "303"], "timing_seeds": ["404", "505", "606"],
         "init_seed": 42}


def _no_child_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _without_time(bundle: Bundle) -> dict:
    return {k: v for k, v in bundle.header.items() if k != "generate_ms"}


@pytest.mark.parametrize("processes", [2, 4, 6])
def test_forked_sets_are_the_sets_made_one_after_another(monkeypatch: Any, tmp_path: Path,
                                                         processes: int) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    serial = Bundle(eval_worker.generate_inputs(ref, json.dumps(dict(SEEDS, input_processes=1))))
    forked = Bundle(eval_worker.generate_inputs(
        ref, json.dumps(dict(SEEDS, input_processes=processes))))
    assert _without_time(forked) == _without_time(serial)
    for index in range(len(serial.entries)):
        assert bytes(forked.raw(index)) == bytes(serial.raw(index))
    assert len({e["sha256"] for e in serial.entries}) == len(serial.entries)
    assert _no_child_left()


def _value_of(seed: int) -> List[Any]:
    torch.default_generator.manual_seed(seed)
    return [torch.randn(3, 5), (seed, 2.5, float("inf"), None, "text", True),
            [torch.arange(4, dtype=torch.int16), torch.zeros(0, 2)], object()]


def test_every_value_kind_crosses_from_a_forked_process() -> None:
    seeds = [1, 2, 3]
    serial_writer, forked_writer = BundleWriter(), BundleWriter()
    serial = describe_seeds(_value_of, seeds, serial_writer, processes=1)
    forked = describe_seeds(_value_of, seeds, forked_writer, processes=3)
    assert forked == serial
    one, other = Bundle(serial_writer.finish({})), Bundle(forked_writer.finish({}))
    assert one.entries == other.entries
    for described in forked:
        assert described["items"][3] == {"t": "other", "type": "object"}
        assert all(torch.equal(a, b) for a, b in zip(
            [other.value(described["items"][0])] + other.value(described["items"][2]),
            [one.value(described["items"][0])] + one.value(described["items"][2])))
        assert other.value(described["items"][1]) == one.value(described["items"][1])
    assert _no_child_left()


def test_a_forked_set_that_raises_fails_the_step_with_its_message() -> None:
    def make(seed: int) -> List[Any]:
        if seed == 3:
            raise ValueError("no inputs for this seed")
        return [torch.ones(2)]

    with pytest.raises(ExecutionError, match=r"^ValueError: no inputs for this seed$") as info:
        describe_seeds(make, [1, 2, 3, 4], BundleWriter(), processes=4)
    assert info.value.kind == "runtime"
    assert _no_child_left()


def test_a_forked_set_keeps_the_kind_of_its_execution_error(monkeypatch: Any,
                                                            tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text().replace(
        "    return [torch.randn(64, 128), torch.randn(64, 128)]",
        "    return None if torch.initial_seed() == 505 else [torch.randn(64, 128)]")
    with pytest.raises(ExecutionError, match=r"get_inputs\(\) must return a list or tuple of "
                                             r"arguments, not NoneType$") as info:
        eval_worker.generate_inputs(ref, json.dumps(dict(SEEDS, input_processes=6)))
    assert info.value.kind == "runtime"
    assert _no_child_left()


def test_a_forked_process_that_dies_fails_the_step() -> None:
    def make(seed: int) -> List[Any]:
        if seed == 2:
            os.kill(os.getpid(), 9)
        return [torch.ones(2)]

    with pytest.raises(ExecutionError, match=r"ended with wait status 9 and no report"):
        describe_seeds(make, [1, 2, 3], BundleWriter(), processes=3)
    assert _no_child_left()


def test_the_first_set_failing_here_stops_the_forked_ones() -> None:
    def make(seed: int) -> List[Any]:
        if seed == 1:
            raise ExecutionError("gpu_access", "get_inputs touched CUDA")
        import time
        time.sleep(30)
        return [torch.ones(2)]

    with pytest.raises(ExecutionError, match="touched CUDA"):
        describe_seeds(make, [1, 2, 3], BundleWriter(), processes=3)
    assert _no_child_left()


def test_numpy_and_random_draws_differ_between_forked_sets() -> None:
    import random

    numpy = pytest.importorskip("numpy")

    def make(seed: int) -> List[Any]:
        return [torch.from_numpy(numpy.random.rand(8)), random.random()]

    writer = BundleWriter()
    described = describe_seeds(make, [1, 2, 3, 4], writer, processes=4)
    bundle = Bundle(writer.finish({}))
    tensors = [bytes(bundle.raw(d["items"][0]["i"])) for d in described]
    floats = [d["items"][1]["v"] for d in described]
    assert len(set(tensors)) == 4 and len(set(floats)) == 4


def test_a_failed_share_gives_each_pid_and_descriptor_back_once(monkeypatch: Any) -> None:
    """A pid is signalled only before it is reaped, a descriptor closed once: either number may
    belong to someone else after."""
    reaped: List[int] = []
    signalled: List[int] = []
    ours: set = set()  # descriptors made by pipe and memfd_create
    open_now: set = set()
    waitpid, kill, close = os.waitpid, os.kill, os.close
    pipe, memfd_create = os.pipe, os.memfd_create

    def recording_waitpid(pid: int, options: int) -> Any:
        out = waitpid(pid, options)
        reaped.append(out[0])
        return out

    def recording_kill(pid: int, signal: int) -> None:
        assert pid not in reaped, f"signalled {pid} after it was reaped"
        signalled.append(pid)
        kill(pid, signal)

    def made(*fds: int) -> None:
        ours.update(fds)
        open_now.update(fds)

    def recording_pipe() -> Any:
        fds = pipe()
        made(*fds)
        return fds

    def recording_memfd_create(name: str, flags: int = 0) -> int:
        fd = memfd_create(name, flags)
        made(fd)
        return fd

    def recording_close(fd: int) -> None:
        if fd in ours:
            assert fd in open_now, f"closed descriptor {fd} twice"
            open_now.discard(fd)
        close(fd)

    for name, fn in (("waitpid", recording_waitpid), ("kill", recording_kill),
                     ("close", recording_close), ("pipe", recording_pipe),
                     ("memfd_create", recording_memfd_create)):
        monkeypatch.setattr(os, name, fn)

    def make(seed: int) -> List[Any]:
        if seed == 3:
            raise ValueError("no inputs for this seed")
        if seed == 4:
            import time
            time.sleep(30)
        return [torch.ones(2)]

    with pytest.raises(ExecutionError, match="no inputs for this seed"):
        describe_seeds(make, [1, 2, 3, 4], BundleWriter(), processes=4)
    monkeypatch.undo()
    assert len(signalled) == 1  # the share still sleeping, not the one that failed
    assert not open_now and _no_child_left()


@pytest.mark.parametrize("tensors", [0, 3, 1030])
def test_a_bundle_written_to_a_file_is_the_bundle_laid_out(tmp_path: Path, tensors: int) -> None:
    # More tensors than one writev takes (1024 buffers), and an empty one among them.
    writer = BundleWriter()
    values = [torch.arange(k % 7, dtype=torch.float32) for k in range(tensors)]
    header = {"values": writer.describe_value(values)}
    path = tmp_path / "bundle"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = writer.write_to(fd, header)
    finally:
        os.close(fd)
    laid_out = bytes(writer.finish(header))
    assert path.read_bytes() == laid_out and size == len(laid_out)
    bundle = Bundle(path.read_bytes())
    assert [bundle.value(d).tolist() for d in bundle.header["values"]["items"]] == \
        [v.tolist() for v in values]
