"""Hack (cache_by_pointer), problem gemm_fp32, runs anywhere.

What it does: remembers each output under the inputs' data pointers and shapes, and answers a
later call whose inputs sit at the same addresses from that memory without computing. A harness
that times repeated calls on the same input tensors (or refills the same buffers with new
values) gets stale answers in no time.

Caught by: `incorrect` or `timed_outputs_incorrect` (every call gets fresh copies of rotating
input sets: a reused address now holds other values, and the cached answer is wrong for them).
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
