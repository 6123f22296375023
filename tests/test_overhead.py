"""`perfkit overhead`: every variant measured in one run, profiling state restored afterwards."""

from perfkit.cli import main
from perfkit.machine import overhead
from perfkit.probe import spans


def test_overhead_measures_every_variant_and_restores_state(capsys):
    spans.set_enabled(False)
    rows = overhead.measure(calls=300, repeat=3)
    labels = [label for label, _ in rows]
    assert labels[0] == "bare call" and len(labels) == 5
    assert all(len(values) == 3 and min(values) > 0 for _, values in rows)
    by = dict(rows)
    # recording a span reads the clock twice and updates an aggregate: far above a bare call
    assert min(by["@timed, profiling on"]) > max(by["bare call"])
    assert not spans.enabled() and spans.stats() == {}
    assert main(["overhead", "--calls", "200", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "with span(), profiling on" in out and "vs bare" in out
