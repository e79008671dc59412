"""Honest: the same product written as an einsum over a transposed copy of B (C_ij = sum_k A_ik Bt_jk)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bt = b.t().contiguous()
        return torch.einsum("ik,jk->ij", a, bt)
