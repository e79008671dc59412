"""The physical floor under a kernel's time, for ``kcoral eval``'s ``faster_than_physics`` flag.

A problem may state ``FLOPS`` (the arithmetic of one forward) and ``BYTES`` (the least memory
traffic one forward needs). No kernel can run faster than

    max(FLOPS / peak_ops, max(BYTES - L2 bytes, 0) / peak_bandwidth)

on a GPU, where the peaks are the vendor's datasheet figures: for arithmetic the highest figure
advertised for any precision, structured sparsity included (so no honest kernel of any dtype
trips it), for memory the HBM bandwidth. The L2's size is subtracted from the bytes because the
timer flushes the L2 before each call but a call's writes may still sit in the L2 when it ends.
GPUs missing from the table get no floor (``known: false``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

# (substring of the device name, HBM bytes/s, highest advertised operations/s). First match wins.
PEAKS: Tuple[Tuple[str, float, float], ...] = (
    ("H100 PCIe", 2.0e12, 3026e12),
    ("H100 NVL", 3.9e12, 3341e12),
    ("H100", 3.35e12, 3958e12),  # SXM5 80 GB: HBM3 3.35 TB/s, FP8 with sparsity 3958 TFLOPS
    ("H200", 4.8e12, 3958e12),  # HBM3e 4.8 TB/s, FP8 with sparsity 3958 TFLOPS
    ("GH200", 4.9e12, 3958e12),
    ("B200", 8.0e12, 18000e12),  # HBM3e 8 TB/s, FP4 with sparsity 18 PFLOPS
    ("A100", 2.039e12, 1248e12),  # 80 GB SXM4: 2.039 TB/s, INT8 with sparsity 1248 TOPS
    ("L40S", 0.864e12, 1466e12),  # GDDR6 864 GB/s, FP8 with sparsity 1466 TFLOPS
)


def peaks_for(name: str) -> Optional[Tuple[float, float]]:
    """``(bytes_per_s, ops_per_s)`` for a device name, or None when it is not in the table."""
    for key, bandwidth, ops in PEAKS:
        if key in name:
            return bandwidth, ops
    return None


def floor_ms(name: str, l2_bytes: int, flops: Optional[float], nbytes: Optional[float]
             ) -> Dict[str, Any]:
    """The floor in milliseconds and how it was found (``floor_ms`` None without a figure)."""
    peaks = peaks_for(name)
    report: Dict[str, Any] = {"device": name, "known": peaks is not None, "flops": flops,
                              "bytes": nbytes, "floor_ms": None}
    if peaks is None or (flops is None and nbytes is None):
        return report
    bandwidth, ops = peaks
    compute_ms = (float(flops) / ops * 1e3) if flops else 0.0
    memory_ms = (max(float(nbytes) - l2_bytes, 0.0) / bandwidth * 1e3) if nbytes else 0.0
    report.update(peak_bytes_per_s=bandwidth, peak_ops_per_s=ops, l2_bytes=l2_bytes,
                  compute_floor_ms=compute_ms, memory_floor_ms=memory_ms,
                  floor_ms=max(compute_ms, memory_ms))
    return report


__all__ = ["PEAKS", "peaks_for", "floor_ms"]
