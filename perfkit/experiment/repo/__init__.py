"""What perfkit sets up in a user's repository: `perfkit init`, the LEDGER.md merge driver and the
notebook clean filter.
"""
