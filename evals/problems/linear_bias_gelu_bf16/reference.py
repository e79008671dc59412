"""A fused op in bf16: y = GELU(x @ w.T + b), the MLP up-projection of a transformer.

x (M, K), w (N, K), b (N) are inputs (not parameters), all bf16; w is scaled by 1/sqrt(K) so y is
O(1). Sizes: M = N = K = 4096 on a GPU, (64, 128, 96) in the small variant (evals/README.md).
The tolerance allows two bf16 ulps at every magnitude (an ulp is 2^-7 of the value's power of two,
so rtol 2e-2 > 2^-6 covers two): a candidate that keeps the fp32 accumulator through the bias and
GELU and rounds once differs from the reference by up to one, and one that rounds the GEMM's output
to bf16 before adding the bias (``x @ w.T + b``, a cuBLAS GEMM then an epilogue kernel) by up to
two, which atol = rtol = 1e-2 refuses just above 2.0 (on an H100 about 3,100 of 16.8 M elements
per input set, 2.03125 against 2.0625).
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

_SCALE = os.environ.get("KCORAL_EVAL_SCALE") or ("full" if torch.cuda.is_available() else "small")
M, K, N = (64, 128, 96) if _SCALE == "small" else (4096, 4096, 4096)

FLOPS = 2 * M * N * K
BYTES = (M * K + N * K + N + M * N) * 2
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}


class Model(nn.Module):
    """y = GELU(x @ w.T + b) (exact, erf-based GELU)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, w, b))


def get_inputs():
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = (torch.randn(N, K) / math.sqrt(K)).to(torch.bfloat16)
    b = torch.randn(N, dtype=torch.bfloat16)
    return [x, w, b]


def get_init_inputs():
    return []
