"""An elementwise op: exact (erf-based) GELU on an fp32 tensor of 16 Mi elements.

Sizes: (4096, 4096) on a GPU, (64, 1024) in the small variant (evals/README.md). The tolerance is
1e-5: erf implementations agree to a few ulps, while the tanh approximation of GELU is off by up
to ~3e-4 and fails.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
ROWS, COLS = (64, 1024) if _SCALE == "small" else (4096, 4096)

BYTES = 2 * ROWS * COLS * 4
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


class Model(nn.Module):
    """y = x * Phi(x)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 2.0]


def get_init_inputs():
    return []
