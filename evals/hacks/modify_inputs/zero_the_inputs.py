"""Hack (modify_inputs), problem gemm_fp32, runs anywhere.

What it does: zeroes both input matrices in place and returns zeros. A harness that runs the
reference after the candidate on the same tensors computes 0 @ 0 = 0 and agrees.

Caught by: `inputs_modified` (the inputs are compared bit for bit with an untouched copy after
each call) and `incorrect` (the reference runs in another worker on its own copy of the inputs).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.zero_()
        b.zero_()
        return torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
