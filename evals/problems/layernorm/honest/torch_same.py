"""Honest: the reference's own code, F.layer_norm."""

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)
