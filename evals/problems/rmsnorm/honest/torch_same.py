"""Honest: the reference's own code (mean of squares, rsqrt, scale)."""

import torch
import torch.nn as nn

EPS = 1e-6


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(ms + EPS) * weight
