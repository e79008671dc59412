"""Honest: the row sums as a matrix-vector product with a vector of ones (a GEMV, fp32)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
        return torch.mv(x, ones)
