"""The GPU-state receipt of a request (kcoral_runtime.gpu_receipt) against the stand-in NVML
(fixtures/nvml/fake_nvml.c): in-process, and in a simulated-GPU child, whose ``sim-<k>`` stands
for the stand-in's NVML index ``k`` and whose program moves the stand-in's readings while it holds
the lease."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import gpu_state  # noqa: E402
from kcoral_runtime.gpu_receipt import RequestReceipt, read_once, visible_device_ids  # noqa: E402

from _doubles import build_fake_nvml  # noqa: E402

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
SW_POWER_CAP = 0x4
GPU_IDLE = 0x1


@pytest.fixture(scope="module")
def nvml_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_fake_nvml(tmp_path_factory.mktemp("receiptnvml") / "libreceipt_fake_nvml.so")


@pytest.fixture
def nvml(nvml_path: str) -> Iterator[ctypes.CDLL]:
    lib = ctypes.CDLL(nvml_path)
    lib.fake_nvml_set.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                  ctypes.c_uint, ctypes.c_ulonglong]
    lib.fake_nvml_reset()
    yield lib
    lib.fake_nvml_reset()
    assert not gpu_state._SESSIONS, "a receipt left NVML open"


# --------------------------------------------------------------------------- in-process


def test_visible_device_ids() -> None:
    assert visible_device_ids(None) == []
    assert visible_device_ids("") == []
    assert visible_device_ids(f" {UUID0} ,, sim-1 ") == [UUID0, "sim-1"]


def test_readings_at_acquisition_and_release_with_identity(nvml, nvml_path) -> None:
    receipt = RequestReceipt([UUID1, "sim-0"], library=nvml_path)
    receipt.open()
    try:
        receipt.begin()
        assert receipt.take() is None  # never held: no receipt
        nvml.fake_nvml_set(1, 1980, 2619, 41, 350_000, GPU_IDLE)
        receipt.acquired()
        nvml.fake_nvml_set(1, 1200, 2619, 85, 700_000, SW_POWER_CAP)
        receipt.acquired()  # held already: the first reading stays
        receipt.releasing()
        got = receipt.take()
    finally:
        receipt.close()
    assert got is not None
    assert got["nvml_error"] is None and got["throttled"] is True
    first, second = got["gpus"]
    assert {k: first[k] for k in ("name", "uuid", "driver_version", "cuda_driver_version")} == {
        "name": "NVIDIA Stand-in 80GB HBM3", "uuid": UUID1, "driver_version": "580.95.05",
        "cuda_driver_version": "13.0"}
    assert first["acquired"] == {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
                                 "temperature_c": 41, "power_w": 350.0,
                                 "reasons": ["gpu_idle"], "throttled": False}
    assert first["released"] == {"sm_clock_mhz": 1200, "mem_clock_mhz": 2619,
                                 "temperature_c": 85, "power_w": 700.0,
                                 "reasons": ["sw_power_cap"], "throttled": True}
    assert first["throttled"] is True
    assert second["uuid"] == UUID0  # sim-0: NVML index 0
    assert second["throttled"] is False and second["acquired"]["reasons"] == ["gpu_idle"]


def test_take_resets_for_the_next_request(nvml, nvml_path) -> None:
    receipt = RequestReceipt([UUID0], library=nvml_path)
    receipt.open()
    try:
        receipt.begin()
        receipt.acquired()
        assert receipt.take()["gpus"][0]["released"] is None  # no release reading taken
        assert receipt.take() is None
        receipt.begin()
        receipt.releasing()  # not held in this request: nothing to read
        assert receipt.take() is None
    finally:
        receipt.close()


def test_without_nvml_the_receipt_names_the_gpus_and_why() -> None:
    receipt = RequestReceipt([UUID0, "sim-3"], library="/nonexistent/libnvidia-ml.so.1")
    receipt.open()
    receipt.begin()
    receipt.acquired()
    receipt.releasing()
    got = receipt.take()
    assert got["nvml_error"].startswith("cannot load NVML (/nonexistent/libnvidia-ml.so.1: ")
    assert got["throttled"] is False
    assert [g["uuid"] for g in got["gpus"]] == [UUID0, None]
    assert all(g["acquired"] is None and g["released"] is None and g["name"] is None
               for g in got["gpus"])


def test_a_gpu_nvml_does_not_know_is_named_in_nvml_error(nvml, nvml_path) -> None:
    receipt = RequestReceipt([UUID0, "GPU-0000-dead"], library=nvml_path)
    receipt.open()
    try:
        receipt.begin()
        receipt.acquired()
        got = receipt.take()
    finally:
        receipt.close()
    assert got["nvml_error"].startswith("no GPU with UUID GPU-0000-dead")
    assert got["gpus"][0]["acquired"]["sm_clock_mhz"] == 1980
    assert got["gpus"][1]["acquired"] is None and got["gpus"][1]["uuid"] == "GPU-0000-dead"


def test_for_worker_reads_cuda_visible_devices(nvml, nvml_path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert RequestReceipt.for_worker(nvml_path) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "sim-1")
    receipt = RequestReceipt.for_worker(nvml_path)
    try:
        receipt.begin()
        receipt.acquired()
        assert receipt.take()["gpus"][0]["uuid"] == UUID1
    finally:
        receipt.close()


# --------------------------------------------------------------------------- in a child

# Moves the stand-in's readings of NVML index 0 while the request holds the lease.
THROTTLE = (
    "import ctypes, os\n"
    "def main():\n"
    "    lib = ctypes.CDLL(os.environ['KCORAL_NVML_LIBRARY'])\n"
    "    lib.fake_nvml_set.argtypes = [ctypes.c_int] + [ctypes.c_uint] * 4 + [ctypes.c_ulonglong]\n"
    "    lib.fake_nvml_set(0, 1410, 2619, 80, 690000, 0x4)\n"
    "    return 1\n"
)


def test_a_child_reports_the_receipt_with_its_outcome(sim_zygote, make_request, kc,
                                                      nvml_path) -> None:
    handle = sim_zygote.child(env={"CUDA_VISIBLE_DEVICES": "sim-0",
                                   "KCORAL_NVML_LIBRARY": nvml_path}, max_requests=0)
    try:
        r = handle.run(make_request(kc.call(THROTTLE)))
        assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
        receipt = r.outcome["gpu_receipt"]
        assert receipt["nvml_error"] is None and receipt["throttled"] is True
        (gpu,) = receipt["gpus"]
        assert gpu["uuid"] == UUID0 and gpu["name"] == "NVIDIA Stand-in 80GB HBM3"
        assert (gpu["acquired"]["sm_clock_mhz"], gpu["acquired"]["reasons"]) == (1980, ["gpu_idle"])
        assert (gpu["released"]["sm_clock_mhz"], gpu["released"]["reasons"]) == (
            1410, ["sw_power_cap"])
        # The next request of the same worker starts a receipt of its own.
        again = handle.run(make_request(kc.call("def main():\n    return 2\n"), lease_held=True))
        gpu = again.outcome["gpu_receipt"]["gpus"][0]
        assert gpu["acquired"]["sm_clock_mhz"] == 1410 and gpu["released"]["sm_clock_mhz"] == 1410
    finally:
        handle.kill()


def test_a_child_whose_request_never_held_the_lease_reports_none(sim_zygote, make_request, kc,
                                                                 nvml_path) -> None:
    handle = sim_zygote.child(env={"CUDA_VISIBLE_DEVICES": "sim-0",
                                   "KCORAL_NVML_LIBRARY": nvml_path}, max_requests=0, init=False)
    try:
        start = sim_zygote.mark()
        sim_zygote.send({"t": "init", "c": handle.c, "context": False})  # deferred: no drain
        ready = sim_zygote.wait(lambda f: f.get("c") == handle.c and f["t"] == "ready", start=start)
        assert ready["context"] == "deferred"
        blob = make_request.blob(b"payload")
        r = handle.run(make_request([kc.upload_blob("b", "bytes", blob)], blobs=[blob]))
        assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
        assert [f["t"] for f in r.frames] == ["outcome"]  # no lease frame
        assert "gpu_receipt" not in r.outcome
    finally:
        handle.kill()


def test_a_child_without_nvml_says_why(sim_zygote, make_request, kc) -> None:
    handle = sim_zygote.child(env={"CUDA_VISIBLE_DEVICES": "sim-1",
                                   "KCORAL_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"},
                              max_requests=0)
    try:
        r = handle.run(make_request(kc.call("def main():\n    return 1\n")))
        receipt = r.outcome["gpu_receipt"]
        assert receipt["nvml_error"].startswith("cannot load NVML")
        assert receipt["gpus"] == [{"name": None, "uuid": None, "driver_version": None,
                                    "cuda_driver_version": None, "acquired": None,
                                    "released": None, "throttled": False}]
    finally:
        handle.kill()


def test_a_cpu_child_reports_no_receipt(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    try:
        r = handle.run(make_request(kc.call("def main():\n    return 1\n")))
        assert "gpu_receipt" not in r.outcome
    finally:
        handle.kill()


# --------------------------------------------------------------------------- the server's reading


def test_read_once_is_the_release_side_only_and_leaves_nvml_closed(nvml, nvml_path) -> None:
    nvml.fake_nvml_set(0, 1410, 2619, 80, 690000, SW_POWER_CAP)
    report = read_once(["sim-0", UUID1], library=nvml_path)
    assert report["nvml_error"] is None
    assert report["throttled"] is True
    first, second = report["gpus"]
    assert first["uuid"] == UUID0 and second["uuid"] == UUID1
    assert first["acquired"] is None and second["acquired"] is None
    assert first["released"]["sm_clock_mhz"] == 1410
    assert first["released"]["reasons"] == ["sw_power_cap"]
    assert first["throttled"] is True and second["throttled"] is False
    assert not gpu_state._SESSIONS


def test_read_once_without_nvml_names_the_gpus_and_why() -> None:
    report = read_once(["sim-0"], library="/nonexistent/libnvidia-ml.so.1")
    assert report["gpus"][0]["released"] is None
    assert report["nvml_error"].startswith("cannot load NVML")


def test_read_once_as_a_command(nvml_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(RUNTIME_DIR), "KCORAL_NVML_LIBRARY": nvml_path}
    proc = subprocess.run([sys.executable, "-m", "kcoral_runtime.gpu_receipt", "sim-0"],
                          capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["gpus"][0]["uuid"] == UUID0
    assert report["gpus"][0]["released"]["sm_clock_mhz"] == 1980
