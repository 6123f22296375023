import numpy as np
import pytest
from records import execution, hypothesis

from perfkit.experiment.records import plots
from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.probe import Sweep
from perfkit.experiment.run.judging import judged
from perfkit.phases import STEP, UNATTRIBUTED
from perfkit.samples import MetricRecord


def case(expect, records_by_params, sweep=None):
    h = hypothesis(expect, sweep)
    executions = [
        execution(*records, key=str(i), params=params) for i, (params, records) in enumerate(records_by_params)
    ]
    item = judged(h, executions)
    return h, item.judgement, list(item.points)


def replicated(expect, processes, sweep=None):
    """Judged from processes: `processes[r]` lists (params, records) that replicate r measured."""
    h = hypothesis(expect, sweep)
    executions = [
        execution(*records, key=str(p), params=params, replicate=r)
        for r, measured in enumerate(processes)
        for p, (params, records) in enumerate(measured)
    ]
    item = judged(h, executions)
    return h, item.judgement, list(item.points)


def plot_verdict(h, j, points, path):
    return plots.write_plot(path, plots.render(h.id, j, points, h.expect.plot))


def drawn_figure(h, j, points):
    """The figure `render` draws for the verdict, drawn, to be read back from its artists."""
    figures = []
    plots.render(h.id, j, points, lambda fig, jj, pp: figures.append(fig) or h.expect.plot(fig, jj, pp))
    (fig,) = figures
    fig.canvas.draw()
    return fig


def noisy(name, mean, unit="ms", n=20, seed=0):
    rng = np.random.default_rng(seed)
    return MetricRecord(
        name=name, unit=unit, samples=tuple(float(x) for x in mean * (1 + 0.05 * rng.standard_normal(n)))
    )


def around(name, mean, sd, *, n=8, seed=0, unit="ms", breakdown=None):
    """n samples of `name` around `mean` with an absolute spread `sd` (negative ones when it straddles 0)."""
    rng = np.random.default_rng(seed)
    samples = tuple(float(x) for x in mean + sd * rng.standard_normal(n))
    return MetricRecord(name=name, unit=unit, samples=samples, breakdown=breakdown)


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
    h, _, _ = CASES["cost"]()
    executions = [execution(noisy("m", 1.0, seed=s), replicate=s) for s in range(3)]
    item = judged(h, executions, confidence=1 - 0.05 / 3)
    fig = drawn_figure(h, item.judgement, list(item.points))
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
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
    fig = drawn_figure(h, j, points)
    ax = fig.axes[0]  # the sweep; beside it, each process's exponent
    for which in ("x", "y"):
        said = _labels(ax, which)
        assert said and len(set(said)) == len(said), (which, said)  # no two ticks read the same
        assert not any("e" in s for s in said), (which, said)  # one notation: 10,000 and 20,000, never 2e+04
    shown = [t.label1 for t in ax.xaxis.get_major_ticks() + ax.xaxis.get_minor_ticks() if t.label1.get_text()]
    boxes = sorted((b.x0, b.x1) for b in (label.get_window_extent() for label in shown if label.get_visible()))
    assert all(left[1] <= right[0] for left, right in zip(boxes, boxes[1:])), boxes  # no label over another
    (legend,) = fig.legends
    box, inside = legend.get_window_extent(), fig.bbox
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1


def test_a_speedup_plot_marks_the_claimed_factor_and_keeps_every_error_bar_on_the_axis():
    wild = MetricRecord(name="slow", unit="ms", samples=(0.05, 4.0, 0.1, 3.9, 0.2, 3.8))  # its interval dips below 0
    h, j, points = case(
        expectation(kind="speedup", baseline="slow", candidate="fast", at_least=10.0),
        [({}, [wild, noisy("fast", 0.053, n=6, seed=2)])],
    )
    fig = drawn_figure(h, j, points)
    arms, ratio = fig.axes
    slow_mean = sum(wild.samples) / len(wild.samples)
    lines = [line for line in arms.get_lines() if line.get_linestyle() == "--"]
    assert len(lines) == 1 and lines[0].get_xdata()[0] == pytest.approx(slow_mean / 10)  # where 10x would be
    for ax in (arms, ratio):
        low, high = ax.get_xlim()
        ends = [
            x for c in ax.collections for seg in getattr(c, "get_segments", list)() for x in (seg[0][0], seg[-1][0])
        ]
        inside = [low * (1 - 1e-9) <= x <= high * (1 + 1e-9) for x in ends]  # to the edge at most (rounding aside)
        assert ends and all(inside), (low, high, ends)  # no whisker runs off the axis


# ---------------------------------------------------------------- every kind, looked at from its artists


def _number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _within(value, limits):
    low, high = sorted(limits)
    slack = (high - low) * 1e-6
    return low - slack <= value <= high + slack


def _overlapping(ax, which):
    """Tick labels drawn over one another (by more than half a pixel)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    labels = [
        t.label1
        for t in axis.get_major_ticks()
        if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high
    ]
    spans = sorted((b.x0, b.x1) if which == "x" else (b.y0, b.y1) for b in (x.get_window_extent() for x in labels))
    return [(a, b) for a, b in zip(spans, spans[1:]) if a[1] > b[0] + 0.5]


def _axis_problems(ax, n):
    """An axis of numbers with fewer than three distinct labels, in another notation or without its scale;
    an axis with no label at all; labels drawn over one another."""
    found = []
    for which in ("x", "y"):
        if _overlapping(ax, which):
            found.append(f"axes {n} {which}: tick labels over one another: {_labels(ax, which)}")
        labels = _labels(ax, which)
        title = (ax.get_xlabel() if which == "x" else ax.get_ylabel()) or ""
        if not labels:
            found.append(f"axes {n} {which}: no tick labels")
        elif all(_number(s) is not None or "$" in s for s in labels):  # numbers, or matplotlib's '10^{2}'
            if len(set(labels)) < 3:
                found.append(f"axes {n} {which}: {labels}: fewer than three labels")
            if any("e" in s or "$" in s for s in labels):
                found.append(f"axes {n} {which}: {labels}: not plain numbers")
            if "scale" not in title:
                found.append(f"axes {n} {which}: the label {title!r} does not say its scale")
    return found


def _at_edge(xy, limits):
    return any(min(abs(xy[i] - end) for end in limits[i]) <= 1e-9 * abs(limits[i][1] - limits[i][0]) for i in (0, 1))


def problems(fig, processes, samples):
    """What a plot must never do, read from the figure's own artists: a sample drawn outside its axes, or
    not drawn; a process without its point; a whisker off the axis; an axis a reader cannot read; a bar on
    a log axis; a value beyond the axis not drawn at its edge."""
    from matplotlib.container import BarContainer

    found, dots, panels = [], 0, 0
    for n, ax in enumerate(fig.axes):
        limits = (ax.get_xlim(), ax.get_ylim())
        for c in ax.collections:
            points = list(c.get_offsets()) if (c.get_gid() or "").startswith("samples") else []
            points += [p for segment in getattr(c, "get_segments", list)() for p in segment]  # whiskers
            dots += len(c.get_offsets()) if (c.get_gid() or "").startswith("samples") else 0
            outside = [p for p in points if not (_within(p[0], limits[0]) and _within(p[1], limits[1]))]
            if outside:
                found.append(f"axes {n}: {c.get_gid()}: {len(outside)} points outside the axes, e.g. {outside[0]}")
        marks = {line.get_gid() for line in ax.get_lines() if (line.get_gid() or "").startswith("process ")}
        panels += bool(marks)
        if marks and marks != {f"process {i}" for i in range(processes)}:
            found.append(f"axes {n}: processes drawn: {sorted(marks)}")
        found += _axis_problems(ax, n)
        if any(isinstance(c, BarContainer) for c in ax.containers) and "log" in (ax.get_xscale(), ax.get_yscale()):
            found.append(f"axes {n}: a bar on a log axis")
        for text in ax.texts:
            if text.get_gid() == "off-axis" and not _at_edge(text.xy, limits):
                found.append(f"axes {n}: {text.get_text()!r} is not at the axis's edge")
    if dots != samples:
        found.append(f"{dots} samples drawn of {samples}")
    if not panels:
        found.append("no process drawn")
    return found


def processes_of(name, means, sd, *, n=8, unit="ms", relative=False, **fields):
    """One record of `name` per process, around each mean (a relative spread with `relative`)."""
    return [
        around(name, m, sd * m if relative else sd, n=n, seed=r + 17 * len(name), unit=unit, **fields)
        for r, m in enumerate(means)
    ]


def _speedup_apart():
    base = processes_of("naive", [2.0, 2.4, 2.2, 80.0, 2.1], 0.1, n=12, relative=True)
    cand = processes_of("compact", [0.1] * 5, 0.1, n=12, relative=True)
    expect = expectation(kind="speedup", baseline="naive", candidate="compact", at_least=10.0)
    return replicated(expect, [[({}, [b, c])] for b, c in zip(base, cand)])


def _share_breakdown():
    processes = []
    for r, step in enumerate((100.0, 104.0, 97.0)):
        phases = {"verify_forward": step * 0.95, "prepare_for_verify": 0.3 + 0.02 * r, UNATTRIBUTED: step * 0.02}
        records = [around(STEP, step, 2.0, n=10, seed=r, breakdown=STEP)]
        records += [around(k, v, 0.05 * v, n=10, seed=r + i, breakdown=STEP) for i, (k, v) in enumerate(phases.items())]
        processes.append([({}, records)])
    return replicated(expectation(kind="share", metric="prepare_for_verify", of=STEP, at_most=0.01), processes)


def _scaling_processes():
    sizes = (512, 1024, 2048, 3072)
    processes = [
        [
            ({"ctx": c}, [around("ttft", 0.12 * c * (1 + 0.06 * r), 0.04 * 0.12 * c, n=5, seed=r * 7 + i)])
            for i, c in enumerate(sizes)
        ]
        for r in range(3)
    ]
    expect = expectation(kind="scaling", metric="ttft", over="ctx", exponent=1.0, tolerance=0.25)
    return replicated(expect, processes, sweep=Sweep(param="ctx", values=sizes))


KNOWN = {
    # a difference (spans on minus off): negative samples, and process 3 far above the others
    "difference": lambda: replicated(
        expectation(kind="at_most", metric="overhead", unit="%", value=1.0),
        [[({}, [r])] for r in processes_of("overhead", [-1.0, -2.0, -4.0, 11.0, -2.0], 2.0, n=12, unit="%")],
    ),
    # the claim (200 ms) 600x beyond what was measured: drawn at the axis's edge, with its number
    "claim-off-axis": lambda: replicated(
        expectation(kind="cost", metric="build", unit="ms", value=200.0, factor=3.0),
        [[({}, [r])] for r in processes_of("build", [0.3, 0.34, 0.31], 0.1, n=10, relative=True)],
    ),
    "ratio-to-floor": lambda: replicated(
        expectation(kind="at_most", metric="verify", unit="ms", floor="floor", factor=2.0),
        [
            [({}, [v, f])]
            for v, f in zip(
                processes_of("verify", [80.0, 74.0, 72.0, 66.0], 3.0, n=8),
                processes_of("floor", [34.0, 22.0, 20.0, 21.0], 1.0, n=5),
            )
        ],
    ),
    "share": _share_breakdown,
    "speedup-apart": _speedup_apart,
    "scaling": _scaling_processes,
    "one-process": lambda: replicated(
        expectation(kind="at_least", metric="accept", unit="tok", value=2.5),
        [[({}, [around("accept", 3.1, 0.4, n=40, unit="tok")])]],
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_every_kind_draws_every_sample_and_process_on_axes_a_reader_can_read(name):
    h, j, points = KNOWN[name]()
    assert j.measured is not None, j.reason
    both = h.expect.kind in ("speedup", "scaling")  # every point drawn; else the measured one
    samples = sum(len(p.samples()) for p in (j.used if both else j.used[:1]))
    fig = drawn_figure(h, j, points)
    assert problems(fig, len(j.used[0].replicates), samples) == []


def test_a_difference_is_drawn_on_a_linear_axis_with_its_negative_samples_and_names_the_process_apart():
    h, j, points = KNOWN["difference"]()
    fig = drawn_figure(h, j, points)
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    assert ax.get_xscale() == "linear" and "linear scale" in ax.get_xlabel()
    assert low < min(points[0].samples()) < 0 < max(points[0].samples()) < high  # nothing hidden left of zero
    (apart,) = [w for w in j.warnings if w.startswith("process 3's mean (")]
    assert "apart from the others'" in apart and "drives the spread" in apart


def test_a_claim_far_beyond_the_data_is_drawn_at_the_edge_with_its_number():
    h, j, points = KNOWN["claim-off-axis"]()
    fig = drawn_figure(h, j, points)
    (ax,) = fig.axes
    (said,) = [t for t in ax.texts if t.get_gid() == "off-axis"]
    assert "200 ms" in said.get_text() and said.xy[0] == pytest.approx(ax.get_xlim()[1])
    assert ax.get_xlim()[1] < 1.0  # the axis is the data's: 0.3 ms is not squeezed against 200


def test_a_process_40x_slower_is_visible_and_named_and_no_arm_is_a_bar_on_a_log_axis():
    from matplotlib.container import BarContainer

    h, j, points = KNOWN["speedup-apart"]()
    fig = drawn_figure(h, j, points)
    arms = fig.axes[0]
    assert arms.get_xscale() == "log" and not any(isinstance(c, BarContainer) for c in arms.containers)
    slow = [c for c in arms.collections if c.get_gid() == "samples 3"]
    assert max(x for c in slow for x, _ in c.get_offsets()) > 50  # its samples lie where they were measured
    (apart,) = [w for w in j.warnings if w.startswith("process 3's speedup (")]
    assert "x the others'" in apart


def test_tick_labels_say_their_values_and_a_log_axis_of_less_than_two_decades_has_at_least_three():
    for low, high in ((47.0, 460.0), (0.07, 7.5), (0.9, 1.4), (8.0, 9.0)):
        for log in (True, False):
            fig = plots.figure()
            ax = fig.add_axes((0.1, 0.1, 0.8, 0.8))
            scale = plots.Scale("y", log, low, high)
            scale.apply(ax, "t [ms]")
            fig.canvas.draw()
            said = _labels(ax, "y")
            values = [_number(s) for s in said]
            assert len(set(said)) >= 3 and None not in values, (low, high, log, said)
            ticks = [t for t in ax.yaxis.get_majorticklocs() if low <= t <= high]
            assert values == pytest.approx(ticks, rel=1e-6), (said, ticks)  # '8.25', never '8.2'


def test_the_look_catches_each_fault_it_is_for():
    """A figure with every fault: the check that passes the shipped kinds names each of them."""
    fig = plots.figure()
    ax = fig.add_axes((0.1, 0.2, 0.8, 0.7))
    ax.barh([0], [5.0])
    ax.scatter([100.0, 3.0], [0.0, 0.0], gid="samples 0")  # one of them beyond the axis, and one never drawn
    ax.plot([5.0], [0.0], marker="o", gid="process 0")  # process 1 has no point
    ax.set_xscale("log")
    ax.set_xlim(1, 10)
    ax.set_xlabel("t [ms]")
    ax.set_yticks([0], ["all"])
    fig.canvas.draw()
    found = problems(fig, processes=2, samples=3)
    assert any("samples 0: 1 points outside the axes" in f for f in found), found
    assert "processes drawn: ['process 0']" in " ".join(found)
    assert any("a bar on a log axis" in f for f in found)
    assert any("not plain numbers" in f for f in found) and any("does not say its scale" in f for f in found)
    assert "2 samples drawn of 3" in found
