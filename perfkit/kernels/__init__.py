"""Kernels of a speculative decode step, each with a reference and a fast implementation behind
one signature, benchmarked in isolation by the probes.

- `tree_build`: `build_tree_heap` (per-request heapq, CPU) / `build_tree_vectorized`
- `verify_mask`: `prepare_for_verify_naive` (O(batch x nodes x context)) / `prepare_for_verify_compact`
- `verify_attention`: attention of the verify block over the KV cache, consuming either mask
"""
