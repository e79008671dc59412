"""Honest: split-K GEMM in torch, C = sum over four K-slices of A[:, s] @ B[s, :] (addmm chain).

A different summation order than the reference; fp32 throughout, so it stays within 1e-3.
"""

import torch
import torch.nn as nn

SPLITS = 4


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k = a.shape[1]
        step = (k + SPLITS - 1) // SPLITS
        out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        for start in range(0, k, step):
            end = min(start + step, k)
            out = torch.addmm(out, a[:, start:end], b[start:end, :])
        return out
