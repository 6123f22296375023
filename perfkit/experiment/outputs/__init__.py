"""What a run's judged results become for their readers: one module per output.

`ledger` (hypotheses/LEDGER.md), `show` (`perfkit show`), `diff` (`perfkit diff` as text and pull-request
markdown), `report` (the offline HTML page), `junit` (JUnit XML for CI test reporters) and `words` (the
phrases they share). Each reads the same stored records (perfkit/experiment/records/results.py); none measures
or judges anything.
"""
