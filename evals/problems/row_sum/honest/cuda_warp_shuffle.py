"""Honest: a CUDA row-sum kernel through load_inline: one 256-thread block per row, float4 loads
where aligned, warp-shuffle reductions, then one warp folds the eight warp sums.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
  const float* row = x + (size_t)blockIdx.x * cols;
  float acc = 0.f;
  if ((cols % 4) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
      float4 v = row4[i];
      acc += (v.x + v.y) + (v.z + v.w);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) acc += row[i];
  }
  __shared__ float partial[32];
  acc = warp_sum(acc);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.f;
    acc = warp_sum(acc);
    if (lane == 0) y[blockIdx.x] = acc;
  }
}

torch::Tensor row_sum(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 2, "2-D fp32 CUDA tensor");
  x = x.contiguous();
  auto y = torch::empty({x.size(0)}, x.options());
  row_sum_kernel<<<(unsigned)x.size(0), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), (int)x.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_CPP_SOURCE = "torch::Tensor row_sum(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ext = load_inline(
            name="kcoral_zoo_row_sum_warp_shuffle",
            cpp_sources=_CPP_SOURCE,
            cuda_sources=_CUDA_SOURCE,
            functions=["row_sum"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.row_sum(x)
