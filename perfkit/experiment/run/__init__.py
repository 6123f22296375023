"""A run's stages: options, the plan and what the ledger knows before it, executing probes (papermill,
the perfkit kernel, warm templates, Dask), judging, and committing results, plots and the ledger.
"""
