"""Honest: the GEMM, bias and GELU in fp32 and one rounding to bf16 at the end.

More accurate than the reference (which rounds to bf16 after the GEMM); within a couple of bf16
ulps of it, inside the problem's 1e-2 tolerance. Slower on a GPU (an fp32 GEMM).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x.float(), w.float().t()) + b.float()
        return F.gelu(y).to(torch.bfloat16)
