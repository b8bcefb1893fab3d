"""Mamba-1 selective scan: pure-JAX reference, Pallas GPU (Triton) and TPU (Mosaic) kernels, custom VJP."""

from jaxlab.kernels.selective_scan.kernel import BlockSizes
from jaxlab.kernels.selective_scan.ops import IMPLS, selective_scan
from jaxlab.kernels.selective_scan.reference import selective_scan_assoc, selective_scan_ref

__all__ = ["BlockSizes", "IMPLS", "selective_scan", "selective_scan_assoc", "selective_scan_ref"]
