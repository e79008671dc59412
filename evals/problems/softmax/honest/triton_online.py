"""Honest: a Triton softmax with the online (running max, rescaled sum) first pass, then a
second pass that writes exp(x - max) / sum. One program per row, fp32.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    run_max = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        v = tl.load(x_ptr + row * stride + cs, mask=cs < cols, other=float("-inf"))
        new_max = tl.maximum(run_max, v)
        # lanes that have seen only -inf keep a zero sum
        scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
        add = tl.where(new_max == float("-inf"), 0.0, tl.exp(v - new_max))
        run_sum = run_sum * scale + add
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lane_scale = tl.where(run_max == float("-inf"), 0.0, tl.exp(run_max - row_max))
    row_sum = tl.sum(run_sum * lane_scale, axis=0)
    for c0 in range(0, cols, BLOCK):
        cs = c0 + offs
        m = cs < cols
        v = tl.load(x_ptr + row * stride + cs, mask=m, other=float("-inf"))
        tl.store(y_ptr + row * stride + cs, tl.exp(v - row_max) / row_sum, mask=m)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        _softmax_kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=1024, num_warps=4)
        return y
