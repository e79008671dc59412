"""Honest: a Triton LayerNorm, one program per row: sums for the mean, then the centred sum of
squares, then the normalised, scaled and shifted row (three sweeps, fp32).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

EPS = 1e-5


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        acc += tl.load(x_row + cs, mask=cs < cols, other=0.0)
    mean = tl.sum(acc, axis=0) / cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        v = tl.load(x_row + cs, mask=cs < cols, other=0.0)
        d = tl.where(cs < cols, v - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + eps)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        m = cs < cols
        v = tl.load(x_row + cs, mask=m, other=0.0)
        w = tl.load(w_ptr + cs, mask=m, other=0.0)
        b = tl.load(b_ptr + cs, mask=m, other=0.0)
        tl.store(y_row + cs, (v - mean) * rstd * w + b, mask=m)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        _layernorm_kernel[(rows,)](
            x, weight.contiguous(), bias.contiguous(), y, cols, x.stride(0), EPS,
            BLOCK=1024, num_warps=4,
        )
        return y
