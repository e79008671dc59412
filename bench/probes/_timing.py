"""What the Python probes share: the median time of a call, in µs; an eval problem on the GPU."""

import importlib.util
import os
import statistics
import time


def median_us(fn, n=400):
    """The median of ``n`` timed calls of ``fn`` (µs, one decimal)."""
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return round(statistics.median(times) / 1000, 1)


def problem_on_gpu(name, set_seeds=(1, 2, 3)):
    """``evals/problems/NAME/reference.py`` loaded: (its module, its Model built with seed 42 on
    the GPU, one input set per seed in ``set_seeds`` on the GPU)."""
    import torch

    path = os.path.join("evals", "problems", name, "reference.py")
    spec = importlib.util.spec_from_file_location(f"probe_problem_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(42)
    model = module.Model(*module.get_init_inputs()).cuda()
    sets = []
    for seed in set_seeds:
        torch.manual_seed(seed)
        sets.append([v.cuda() if isinstance(v, torch.Tensor) else v for v in module.get_inputs()])
    return module, model, sets
