"""What a timed call of ``kcoral eval`` costs beyond the kernel itself. (GPU only.)

``candidate_timing`` of the 4096² fp32 GEMM verdict was ~900 ms for 25 warmup + 100 timed calls of
a 2.67 ms kernel. Per problem, in one process, on the reference model and three timing sets:

* the wall time of ``benchmarking.measure`` with the same arguments every call (no rotation) and
  with ``eval_timing.Rotation`` (fresh copies, checks, captured outputs), and of ``time_model`` with
  the settings under ``--settings`` (JSON objects; default: 25 + 100 and a verdict's own,
  ``eval_worker.EVAL_TIMING``);
* the rotation's steps alone, each closed by a device synchronize: checking the previous call's
  inputs, capturing its output, comparing it with the set's first output, placing the next copy.

    PYTHONPATH=runtime_py KCORAL_EVAL_SCALE=full python3 bench/probes/eval_call_cost.py \
        [--problems gemm_fp32,layernorm] [--settings '{"warmup":25,"repeat":100}' ...]
"""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import problem_on_gpu  # noqa: E402  (bench/probes/_timing.py)

from kcoral_runtime.benchmarking import Settings, measure
from kcoral_runtime.eval_bundle import capture_value
from kcoral_runtime.eval_timing import Rotation, same_value, time_model
from kcoral_runtime.eval_worker import EVAL_TIMING


def _args(name: str):
    return [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == name]



def _wall_ms(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _steps(model, sets, calls: int = 30) -> None:
    rotation = Rotation(model, sets)
    parts = {"check inputs": [], "capture output": [], "compare with first": [], "place": [],
             "call": []}
    rotation.before()
    rotation.call()
    for _ in range(calls):
        k = rotation.set_index
        parts["check inputs"].append(_wall_ms(lambda: same_value(rotation.args, rotation.sets[k])))
        kept = []
        parts["capture output"].append(_wall_ms(lambda: kept.append(capture_value(rotation.output))))
        first = rotation.first.setdefault(k, kept[0])
        parts["compare with first"].append(
            _wall_ms(lambda: same_value(kept[0], first, None, exact=False)))
        rotation.args = None  # the steps above stand in for _check_previous
        rotation.set_index = rotation._next_set()
        rotation.slot = rotation._next_slot()
        parts["place"].append(
            _wall_ms(lambda: setattr(rotation, "args", rotation._place(rotation.sets[k], []))))
        parts["call"].append(_wall_ms(rotation.call))
    rotation.finish()
    for name, ms in parts.items():
        print(f"|   step: {name} | {statistics.median(ms):.3f} ms | min {min(ms):.3f} |"
              f" max {max(ms):.3f} |", flush=True)


def main() -> None:
    problems = (_args("--problems") or ["gemm_fp32,layernorm"])[0].split(",")
    variants = [json.loads(s) for s in _args("--settings")] or [
        {"warmup": 25, "repeat": 100},
        dict(EVAL_TIMING),  # a verdict's default
    ]
    print(f"{torch.cuda.get_device_name(0)}")
    for name in problems:
        _, model, sets = problem_on_gpu(name)
        print(f"\n| {name} | wall ms | per call ms | median ms | rel CI | calls |")
        print("|---|---|---|---|---|---|")
        with torch.no_grad():
            for _ in range(2):
                plain = {}
                wall = _wall_ms(lambda: plain.update(measure(
                    "plain", model, sets[0], Settings(warmup=25, repeat=100))))
                print(f"| measure, same args, 25+100 | {wall:.0f} | {wall / 125:.3f} |"
                      f" {plain['latency_ms_median']:.4f} | {plain.get('ci95_rel_half_width')} | 125 |",
                      flush=True)
                for settings in variants:
                    got = {}
                    wall = _wall_ms(lambda: got.update(
                        time_model("candidate", Rotation(model, sets), settings, "cuda")))
                    calls = int(got["warmup"]) + int(got["repeat"])
                    print(f"| time_model {json.dumps(settings)} | {wall:.0f} |"
                          f" {wall / calls:.3f} | {got['latency_ms_median']:.4f} |"
                          f" {got.get('ci95_rel_half_width')} | {calls} |", flush=True)
            _steps(model, sets)


if __name__ == "__main__":
    main()
