"""Honest: cuBLAS for the GEMM (torch::matmul in a load_inline extension) and a custom CUDA
epilogue kernel that adds the bias and applies exact GELU in fp32, in place, on the bf16 result.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

__global__ void bias_gelu_inplace(__nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ bias,
                                  long long rows, long long cols) {
  long long total = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    float v = __bfloat162float(y[i]) + __bfloat162float(bias[i % cols]);
    // the reference rounds the biased linear output to bf16 before GELU; do the same
    v = __bfloat162float(__float2bfloat16(v));
    y[i] = __float2bfloat16(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

torch::Tensor linear_bias_gelu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "bf16 only");
  auto y = torch::matmul(x, w.t()).contiguous();
  auto bias = b.contiguous();
  long long rows = y.size(0), cols = y.size(1);
  int threads = 256;
  long long blocks = (rows * cols + threads - 1) / threads;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;
  bias_gelu_inplace<<<(unsigned)blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()),
      reinterpret_cast<const __nv_bfloat16*>(bias.data_ptr<at::BFloat16>()), rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_CPP_SOURCE = "torch::Tensor linear_bias_gelu(torch::Tensor x, torch::Tensor w, torch::Tensor b);"


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ext = load_inline(
            name="kcoral_zoo_linear_bias_gelu_epilogue",
            cpp_sources=_CPP_SOURCE,
            cuda_sources=_CUDA_SOURCE,
            functions=["linear_bias_gelu"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.ext.linear_bias_gelu(x, w, b)
