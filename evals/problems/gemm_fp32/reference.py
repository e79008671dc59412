"""GEMM in fp32: C = A @ B with A, B square (4096 x 4096 on a GPU).

The time-to-verdict problem of issue 40. Sizes: 4096 on a GPU, 64 in the small variant
(KCORAL_EVAL_SCALE=small, or no CUDA and KCORAL_EVAL_SCALE unset; evals/README.md).
fp32 accumulation in a different order differs from the reference by ~1e-4 at K = 4096, so the
tolerance is 1e-3; TF32, fp16 or bf16 inputs differ by > 1e-2 and fail it.
"""

import os

import torch
import torch.nn as nn

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
N = 64 if _SCALE == "small" else 4096

FLOPS = 2 * N * N * N
BYTES = 3 * N * N * 4
TOLERANCE = {"atol": 1e-3, "rtol": 1e-3}


class Model(nn.Module):
    """C = A @ B."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
