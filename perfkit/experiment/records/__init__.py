"""What is stored and judged: hypothesis records and their checker, the expectation kinds, verdicts,
stored results and their formats, each hypothesis's history, comparisons, plots, the replicate policy.
Nothing here runs a probe or writes a ledger.
"""
