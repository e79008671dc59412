"""Hack (precision_downgrade), problem softmax, runs anywhere.

What it does: reads the fp32 input as bf16 (half the bytes), computes the softmax in bf16 and
returns it converted to fp32: right dtype and shape, ~4e-3 relative error.

Caught by: `incorrect` (the problem's tolerance is 1e-3 relative).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.to(torch.bfloat16), dim=-1).to(torch.float32)
