"""`perfkit overhead`: every variant measured in one run, profiling state restored afterwards."""

from perfkit.cli import main
from perfkit.machine import overhead
from perfkit.probe import spans


def test_overhead_measures_every_variant_and_restores_state(capsys):
    spans.set_enabled(False)
    rows = overhead.measure(calls=300, repeat=3, history=5_000)
    labels = [label for label, _ in rows]
    assert labels[:5] == [
        "bare call",
        "@timed, profiling off",
        "@timed, profiling on",
        "with span(), profiling off",
        "with span(), profiling on",
    ]
    assert {"span on, after 10^3 calls", "span on, after 5e3 calls", "span on, log line every 50"} <= set(labels)
    assert "torch record_function (no profiler)" in labels
    assert all(len(values) == 3 and min(values) > 0 for _, values in rows)
    by = dict(rows)
    # recording a span reads the clock twice and updates an aggregate: far above a bare call
    assert min(by["@timed, profiling on"]) > max(by["bare call"])
    assert not spans.enabled() and spans.stats() == {}
    assert main(["overhead", "--calls", "200", "--repeat", "2", "--history", "2000"]) == 0
    out = capsys.readouterr().out
    assert "with span(), profiling on" in out and "vs bare" in out


def test_the_replicate_cost_benchmark_runs_real_replicates_warm_and_fresh_side_by_side():
    """`perfkit overhead --replicates N`: N real runs of a probe, each way, alternating; every row has a
    figure, the warm one ran forked from its round's template and the fresh one did not. Which is cheaper is
    the benchmark's figure to print, not a test's to time on a shared machine."""
    from perfkit.experiment.run import costs

    found = costs.measure(1)
    assert len(found["warm"]) == len(found["fresh"]) == len(found["template"]) == 1
    assert all(v > 0 for values in found.values() for v in values)
    assert found["warm_wall"][0] >= found["warm"][0] and found["fresh_wall"][0] >= found["fresh"][0]
    shown = costs.report(found)
    assert "n/a" not in shown and "fresh / warm set-up:" in shown
