"""Honest: RMSNorm from the row's Euclidean norm: mean(x^2) = ||x||^2 / D (torch.linalg.vector_norm)."""

import torch
import torch.nn as nn

EPS = 1e-6


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return x * torch.rsqrt(norm * norm / x.shape[-1] + EPS) * weight
