import numpy as np
import pytest
from records import execution, hypothesis

from perfkit.experiment.records import plots
from perfkit.experiment.records.hypothesis import Sweep
from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.run.judging import judged
from perfkit.samples import MetricRecord


def case(expect, records_by_params, sweep=None):
    h = hypothesis(expect, sweep)
    executions = [
        execution(*records, key=str(i), params=params) for i, (params, records) in enumerate(records_by_params)
    ]
    item = judged(h, executions)
    return h, item.judgement, list(item.points)


def plot_verdict(h, j, points, path, *, dpi=plots.DPI):
    return plots.write_plot(path, plots.render(h.id, j, points, h.expect.plot, dpi=dpi))


def noisy(name, mean, unit="ms", n=20, seed=0):
    rng = np.random.default_rng(seed)
    return MetricRecord(
        name=name, unit=unit, samples=tuple(float(x) for x in mean * (1 + 0.05 * rng.standard_normal(n)))
    )


CASES = {
    "cost": lambda: case(
        expectation(kind="cost", metric="m", unit="ms", value=200.0, factor=3.0), [({}, [noisy("m", 0.18)])]
    ),
    "at_least": lambda: case(
        expectation(kind="at_least", metric="m", unit="tok/s", value=5.0), [({}, [noisy("m", 5.2, unit="tok/s")])]
    ),
    "share-plain": lambda: case(
        expectation(kind="share", metric="a", of="b", at_most=0.1), [({}, [noisy("a", 1.0), noisy("b", 4.0, seed=1)])]
    ),
    "scaling": lambda: case(
        expectation(kind="scaling", metric="m", over="ctx", exponent=1.0, tolerance=0.25),
        [({"ctx": c}, [noisy("m", c * 1e-3, seed=c)]) for c in (1024, 4096, 16384)],
        sweep=Sweep(param="ctx", values=(1024, 4096, 16384)),
    ),
    "speedup": lambda: case(
        expectation(kind="speedup", baseline="slow", candidate="fast", at_least=100.0),
        [({}, [noisy("slow", 47.0), noisy("fast", 0.1, seed=2)])],
    ),
    "no-data": lambda: case(expectation(kind="cost", metric="m", unit="ms", value=1.0, factor=2.0), [({}, [])]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_plots_and_the_bytes_are_reproducible(tmp_path, name):
    h, j, points = CASES[name]()
    first = plot_verdict(h, j, points, tmp_path / "a.png").read_bytes()
    second = plot_verdict(h, j, points, tmp_path / "b.png").read_bytes()
    assert first.startswith(b"\x89PNG") and first == second
    assert len(first) < 80_000  # small enough to commit next to the ledger


def test_the_ledger_copy_is_scaled_from_the_one_rendering_not_drawn_again():
    import io

    from PIL import Image

    h, j, points = CASES["cost"]()
    png = plots.render(h.id, j, points, h.expect.plot)
    small = plots.scaled(png, plots.LEDGER_DPI / plots.DPI)
    assert small == plots.scaled(png, plots.LEDGER_DPI / plots.DPI)  # the same bytes every time
    with Image.open(io.BytesIO(png)) as big, Image.open(io.BytesIO(small)) as thumb:
        assert big.size == (960, 540) and thumb.size == (640, 360)  # 6.4 x 3.6 in at 150 and 100 dpi
    assert len(small) < len(png)


def test_a_plot_prints_the_level_its_verdict_was_judged_at():
    from perfkit.experiment.run.judging import judged

    h, _, _ = CASES["cost"]()
    executions = [execution(noisy("m", 1.0, seed=s), replicate=s) for s in range(3)]
    item = judged(h, executions, confidence=1 - 0.05 / 3)
    drawn = []
    plots.render(
        h.id, item.judgement, list(item.points), lambda fig, jj, pp: drawn.append(fig) or h.expect.plot(fig, jj, pp)
    )
    labels = [t.get_text() for ax in drawn[0].axes for t in ax.get_legend().get_texts()] if drawn else []
    assert "mean, 98.3% interval" in labels


def _labels(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return [
        t.label1.get_text()
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high
    ]


@pytest.mark.parametrize("contexts", [(8192, 16384, 32768, 65536), (1024, 131072)])
def test_a_flat_scaling_plot_has_distinct_tick_labels_in_one_notation_and_its_legend_inside(contexts):
    """compact-mask-flat-in-context: y flat near 0.05 ms (six labels read '5e-02'), x from 8k to 64k."""
    h, j, points = case(
        expectation(kind="scaling", metric="mask_build_compact", over="ctx", exponent=0.0, tolerance=0.2),
        [({"ctx": c}, [noisy("mask_build_compact", 0.05, seed=c)]) for c in contexts],
        sweep=Sweep(param="ctx", values=contexts),
    )
    fig = plots.figure()
    h.expect.plot(fig, j, points)
    fig.canvas.draw()
    (ax,) = fig.axes
    for which in ("x", "y"):
        said = _labels(ax, which)
        assert said and len(set(said)) == len(said), (which, said)  # no two ticks read the same
        assert not any("e" in s for s in said), (which, said)  # one notation: 10,000 and 20,000, never 2e+04
    shown = [t.label1 for t in ax.xaxis.get_major_ticks() + ax.xaxis.get_minor_ticks() if t.label1.get_text()]
    boxes = sorted((b.x0, b.x1) for b in (label.get_window_extent() for label in shown if label.get_visible()))
    assert all(left[1] <= right[0] for left, right in zip(boxes, boxes[1:])), boxes  # no label over another
    legend = ax.get_legend().get_window_extent()
    inside = fig.bbox
    assert inside.x0 <= legend.x0 and legend.x1 <= inside.x1 and inside.y0 <= legend.y0 and legend.y1 <= inside.y1


def test_a_speedup_plot_marks_the_claimed_factor_and_keeps_every_error_bar_on_the_axis():
    wild = MetricRecord(name="slow", unit="ms", samples=(0.05, 4.0, 0.1, 3.9, 0.2, 3.8))  # its interval dips below 0
    h, j, points = case(
        expectation(kind="speedup", baseline="slow", candidate="fast", at_least=10.0),
        [({}, [wild, noisy("fast", 0.053, n=6, seed=2)])],
    )
    fig = plots.figure()
    h.expect.plot(fig, j, points)
    fig.canvas.draw()
    (ax,) = fig.axes
    slow_mean = sum(wild.samples) / len(wild.samples)
    lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(lines) == 1 and lines[0].get_xdata()[0] == pytest.approx(slow_mean / 10)  # where 10x would be
    low, high = ax.get_xlim()
    ends = [x for c in ax.collections for seg in c.get_segments() for x in (seg[0][0], seg[-1][0])]
    inside = [low * (1 - 1e-9) <= x <= high * (1 + 1e-9) for x in ends]  # to the edge at most (rounding aside)
    assert ends and all(inside), (low, high, ends)  # no bar runs off the axis
