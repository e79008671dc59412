"""Honest: a Triton RMSNorm, one program per row: the sum of squares, then the scaled row."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

EPS = 1e-6


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        v = tl.load(x_ptr + row * stride + cs, mask=cs < cols, other=0.0)
        acc += v * v
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + eps)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        m = cs < cols
        v = tl.load(x_ptr + row * stride + cs, mask=m, other=0.0)
        w = tl.load(w_ptr + cs, mask=m, other=0.0)
        tl.store(y_ptr + row * stride + cs, v * rstd * w, mask=m)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        _rmsnorm_kernel[(rows,)](x, weight.contiguous(), y, cols, x.stride(0), EPS, BLOCK=1024, num_warps=4)
        return y
