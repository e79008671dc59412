"""A normalisation: LayerNorm over the last dimension with weight and bias given as inputs.

x (B, D), weight (D), bias (D), fp32, eps 1e-5. Sizes: (8192, 4096) on a GPU, (64, 256) in the
small variant (evals/README.md). FLOPS is left out (it depends on how variance is formed); BYTES
is the read of x, weight and bias and the write of y.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
B, D = (64, 256) if _SCALE == "small" else (8192, 4096)
EPS = 1e-5

BYTES = (2 * B * D + 2 * D) * 4
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


class Model(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, per row."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)


def get_inputs():
    return [torch.randn(B, D) * 2.0 + 0.5, torch.randn(D), torch.randn(D)]


def get_init_inputs():
    return []
