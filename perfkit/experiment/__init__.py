"""The experiment: hypothesis records, their expectation kinds, planning and executing probes,
judging verdicts, storing results, plotting and writing the ledger.
"""
