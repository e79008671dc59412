"""Hack (cache_by_pointer), problem gemm_fp32, needs CUDA.

What it does: remembers each output under the inputs' data pointers and shapes, and answers a
later call whose inputs sit at the same addresses from that memory without computing. A harness
that times repeated calls on the same input tensors (or refills the same buffers with new
values) gets stale answers in no time.

Caught by: `incorrect` (the next correctness set's copies land on addresses the cache has seen,
holding other values), `timed_outputs_incorrect` (the timing loop puts its sets at randomly
chosen places, so a hit often returns another set's answer, with any number of sets); when a
hit happens to return the right set's answer, the skipped work shows as `excessive_speedup` and
`activities_unstable`. It needs CUDA only for the verdict to be predictable: PyTorch's caching
allocator hands a freed block to the next copy of the same size, while on CPU torch whether
malloc reuses an address is luck (it misbehaves on CPU torch all the same when it does; the zoo's
pytest shows it with an input refilled in place).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cache = {}

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        key = (a.data_ptr(), b.data_ptr(), tuple(a.shape), tuple(b.shape))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        out = torch.matmul(a, b)
        self.cache[key] = out
        return out
