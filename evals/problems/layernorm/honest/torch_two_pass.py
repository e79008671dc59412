"""Honest: LayerNorm written out in torch: the mean, then the biased variance of the centred
rows, rsqrt, scale and shift (two passes over each row, fp32).
"""

import torch
import torch.nn as nn

EPS = 1e-5


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        var = (centred * centred).mean(dim=-1, keepdim=True)
        return centred * torch.rsqrt(var + EPS) * weight + bias
