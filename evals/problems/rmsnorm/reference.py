"""RMSNorm over the last dimension, weight given as an input (LLaMA-style), fp32, eps 1e-6.

x (B, D), weight (D). Sizes: (8192, 4096) on a GPU, (64, 256) in the small variant
(evals/README.md). BYTES is the read of x and weight and the write of y.
"""

import os

import torch
import torch.nn as nn

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
B, D = (64, 256) if _SCALE == "small" else (8192, 4096)
EPS = 1e-6

BYTES = (2 * B * D + D) * 4
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


class Model(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, per row."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(ms + EPS) * weight


def get_inputs():
    return [torch.randn(B, D), torch.randn(D)]


def get_init_inputs():
    return []
