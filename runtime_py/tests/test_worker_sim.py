"""Simulated-GPU mode: targets, tensors, lease placement, reuse hygiene."""

from __future__ import annotations

import hashlib
import struct
import time
from pathlib import Path

import numpy
import pytest
import torch


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def child(sim_zygote):
    handle = sim_zygote.child(env={"CUDA_VISIBLE_DEVICES": "sim-0,sim-2"}, max_requests=0)
    yield handle
    handle.kill()


def test_hello_ready_and_visible_devices(sim_zygote, child) -> None:
    hello = sim_zygote.hello
    assert hello["mode"] == "sim" and hello["sim_devices"] == 4
    assert hello["versions"]["simulated"] == "cpu"
    assert hello["versions"]["torch"] == str(torch.__version__)
    assert child.ready["target"] == {"arch": "simulated"}
    assert child.ready["device_uuids"] == ["sim-0", "sim-2"]
    assert child.ready["versions"] == hello["versions"]
    every = sim_zygote.child(unset=["CUDA_VISIBLE_DEVICES"], max_requests=1)
    assert every.ready["device_uuids"] == ["sim-0", "sim-1", "sim-2", "sim-3"]
    every.kill()


@pytest.mark.parametrize("spec", ["sim-4", "sim-1,sim-1", "gpu-0", ""])
def test_bad_visible_devices_fail_init(sim_zygote, spec) -> None:
    start = sim_zygote.mark()
    handle = sim_zygote.child(env={"CUDA_VISIBLE_DEVICES": spec})
    assert handle.ready["t"] == "init_failed"
    assert handle.ready["message"].startswith("RuntimeError: ")
    assert "Traceback" in handle.ready["traceback"]
    exited = handle.wait_exited(start=start)
    assert (exited["code"], exited["signal"], exited["orphans"]) == (1, None, False)


def test_spec_worked_example(make_request, child, kc) -> None:
    data = struct.pack("<4f", 1, 2, 3, 4)
    blob = make_request.blob(data)
    assert blob == "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1"
    instructions = [
        kc.module("upload_0", "def add_one(x):\n    return x + 1\n"),
        kc.get_function("get_function_1", "upload_0", "add_one"),
        kc.upload_blob("upload_2", "tensor", blob, dtype="float32", shape=[4]),
        kc.run("run_3", "get_function_1", kc.ref("upload_2")),
        kc.ret("y", "run_3"),
    ]
    r = child.run(make_request(instructions, blobs=[blob]))
    assert r.outcome["results"] == (
        '{"y":{"type":"tensor","part":"return:0","sha256":'
        '"1180e36f58837887478f2d0dc12271b6ec4b103f20b533f8af7d44c313e27c18",'
        '"dtype":"float32","shape":[4]}}'
    )
    assert Path(r.outcome["parts"][0]["path"]).read_bytes() == struct.pack("<4f", 2, 3, 4, 5)


@pytest.mark.parametrize(
    "dtype, shape, data",
    [
        ("bfloat16", [2, 2], bytes([0x80, 0x3F, 0x00, 0xC0, 0x00, 0x00, 0x80, 0x7F])),
        ("bool", [3], bytes([1, 0, 1])),
        ("float8_e4m3fn", [2], bytes([0x38, 0xB8])),
        ("int64", [], struct.pack("<q", -5)),
        ("float16", [0, 3], b""),
        ("uint8", [2, 1, 2], bytes([1, 2, 3, 4])),
    ],
)
def test_tensor_round_trip(make_request, child, kc, dtype, shape, data) -> None:
    blob = make_request.blob(data)
    source = "def same(x):\n    return x\n"
    instructions = [
        kc.module("m", source), kc.get_function("f", "m", "same"),
        kc.upload_blob("t", "tensor", blob, dtype=dtype, shape=shape),
        kc.run("r", "f", kc.ref("t")), kc.ret("t", "r"),
    ]
    r = child.run(make_request(instructions, blobs=[blob]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    assert r.results["t"] == {"type": "tensor", "part": "return:0", "sha256": sha(data),
                              "dtype": dtype, "shape": shape}
    assert Path(r.outcome["parts"][0]["path"]).read_bytes() == data


def test_uploaded_tensor_is_private_and_writable(make_request, child, kc) -> None:
    data = numpy.arange(8, dtype="<f4").tobytes()
    blob = make_request.blob(data)
    source = "def bump(x):\n    x.mul_(2)\n    return x.sum().item()\n"
    instructions = [kc.module("m", source), kc.get_function("f", "m", "bump"),
                    kc.upload_blob("t", "tensor", blob, dtype="float32", shape=[2, 4]),
                    kc.run("r", "f", kc.ref("t")), kc.ret("r", "r")]
    r = child.run(make_request(instructions, blobs=[blob]))
    assert r.results["r"] == {"type": "number", "value": 56.0}
    assert (make_request.blob_dir / blob).read_bytes() == data  # the blob file is untouched


def test_malformed_tensor(make_request, child, kc) -> None:
    blob = make_request.blob(b"\0" * 6)
    r = child.run(make_request([kc.upload_blob("t", "tensor", blob, dtype="float32", shape=[2])], blobs=[blob]))
    error = r.outcome["error"]
    assert error["kind"] == "runtime" and error["message"].startswith("malformed tensor: ")


def test_sim_get_function_on_other_handles_is_runtime(make_request, child, kc) -> None:
    blob = make_request.blob(b"lib")
    r = child.run(make_request([kc.upload_blob("b", "bytes", blob), kc.get_function("f", "b", "x")], blobs=[blob]))
    assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == (
        "runtime", "get_function expects an uploaded module or library handle")


def test_lease_placement_follows_spec(make_request, child, kc) -> None:
    """spec protocol §2.5: file upload / file-folder return / cpu_only run release; bytes
    upload leaves the lease as is; everything else acquires; the end re-acquires."""
    blob = make_request.blob(b"payload")
    source = "import os\ndef compile(p):\n    os.makedirs('d', exist_ok=True)\n    return p\ndef gpu(x):\n    return 1\n"
    instructions = [
        kc.module("m", source),                                   # 0 acquire
        kc.upload_blob("b", "bytes", blob),                       # 1 -
        kc.upload_blob("f", "file", blob, path="in/data"),        # 2 release
        kc.upload_blob("t", "tensor", blob, dtype="uint8", shape=[7]),  # 3 acquire
        kc.get_function("c", "m", "compile", cpu_only=True),      # 4 (held)
        kc.run("p", "c", kc.ref("f")),                            # 5 release
        kc.upload_blob("b2", "bytes", blob),                      # 6 -
        kc.get_function("g", "m", "gpu"),                         # 7 acquire
        kc.run("x", "g", kc.ref("t")),                            # 8 (held)
        kc.ret("x", "x"),                                         # 9 (held)
        kc.ret_path("file", "file", kc.ref("p")),                 # 10 release
        kc.ret_path("dir", "folder", "d"),                        # 11 -
    ]
    r = child.run(make_request(instructions, blobs=[blob]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    # Which instruction took or dropped it: test_engine.py (the same placement, in-process).
    seen = [frame.get("a", frame["t"]) for frame in r.frames]
    assert seen == ["acquire", "release", "acquire", "release", "acquire", "release", "acquire",
                    "outcome"]


def test_acquire_blocks_until_granted(sim_zygote, make_request, child, kc) -> None:
    start = sim_zygote.mark()
    sim_zygote.auto_grant = False
    try:
        child.send({"t": "run", "req": make_request(kc.call("def main():\n    return 1\n"))})
        sim_zygote.wait(lambda f: f.get("c") == child.c and f["t"] == "lease", start=start)
        time.sleep(0.2)
        assert [f["t"] for f in sim_zygote.frames_of(child.c, start)] == ["lease"]
        child.send({"t": "lease", "a": "granted"})
        frame = sim_zygote.wait(lambda f: f.get("c") == child.c and f["t"] == "outcome", start=start)
    finally:
        sim_zygote.auto_grant = True
    assert frame["outcome"]["status"] == "COMPLETED"
    assert [f["t"] for f in sim_zygote.frames_of(child.c, start)] == ["lease", "outcome"]


def test_reuse_restores_torch_knobs_and_environment(sim_zygote, make_request, kc) -> None:
    handle = sim_zygote.child(env={"KC_KEEP": "yes"}, max_requests=0)
    change = (
        "import ctypes, os, torch\n"
        "def main():\n"
        "    torch.set_default_dtype(torch.float64)\n"
        "    torch.backends.cudnn.benchmark = True\n"
        "    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False\n"
        "    torch.set_grad_enabled(False)\n"
        "    torch.use_deterministic_algorithms(True)\n"
        "    os.environ['KC_PY'] = '1'\n"
        "    del os.environ['KC_KEEP']\n"
        "    ctypes.CDLL(None).setenv(b'KC_NATIVE', b'2', 1)\n"
        "    return os.getpid()\n"
    )
    look = (
        "import ctypes, os, torch\n"
        "def main():\n"
        "    libc = ctypes.CDLL(None)\n"
        "    libc.getenv.restype = ctypes.c_char_p\n"
        "    return [os.getpid(), str(torch.get_default_dtype()), torch.backends.cudnn.benchmark,\n"
        "            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,\n"
        "            torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),\n"
        "            os.environ.get('KC_PY'), os.environ.get('KC_KEEP'), libc.getenv(b'KC_NATIVE'),\n"
        "            libc.getenv(b'KC_KEEP').decode()]\n"
    )
    first = handle.run(make_request(kc.call(change)))
    assert first.outcome["status"] == "COMPLETED" and first.retire is None
    second = handle.run(make_request(kc.call(look)))
    values = [node.get("value") for node in second.results["r"]["value"]]
    assert values == [first.results["r"]["value"], "torch.float32", False, True, True, False,
                      None, "yes", None, "yes"]
    assert values[0] == handle.pid
    handle.kill()
