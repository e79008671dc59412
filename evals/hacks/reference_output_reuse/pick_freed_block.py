"""Hack (reference_output_reuse), problem gemm_fp32, runs anywhere.

What it does: computes nothing. It allocates a few uninitialised tensors of the output's size,
betting that the allocator hands back the block the reference's output just occupied (in a
harness that runs the reference first in the same process, it often does), and returns the first
one that holds finite, non-zero values that look like a GEMM result.

Caught by: `incorrect`: the reference never runs in the candidate's process (it runs in another
worker, after this one has exited), and freed device memory is filled with NaN before each
correctness call.
"""

import torch
import torch.nn as nn

TRIES = 8


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        shape = (a.shape[0], b.shape[1])
        blocks = [torch.empty(shape, dtype=a.dtype, device=a.device) for _ in range(TRIES)]
        for block in blocks:
            if bool(torch.isfinite(block).all()) and float(block.abs().max()) > 0:
                return block
        return blocks[-1]
