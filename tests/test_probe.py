import math
import time

import IPython
import IPython.display
import nbformat
import pytest

import perfkit
from perfkit.errors import UserError
from perfkit.experiment.run.executed import records_in
from perfkit.phases import BREAKDOWN, PHASES, STEP, UNATTRIBUTED
from perfkit.probe.recording import make_record
from perfkit.samples import MIMETYPE, decode_samples, encode_samples


def test_non_finite_samples_survive_json():
    samples = [1.0, math.nan, math.inf, -math.inf]
    back = decode_samples(encode_samples(samples))
    assert back[0] == 1.0 and math.isnan(back[1]) and back[2:] == [math.inf, -math.inf]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"name": "t", "samples": [1.0], "unit": "msec"}, "unknown unit 'msec'"),
        ({"name": "t", "samples": ["1"], "unit": "ms"}, "samples must be numbers"),
        ({"name": "", "samples": [1.0], "unit": "ms"}, "non-empty string"),
        ({"name": "t", "samples": [1.0], "unit": "ms", "at": {"ctx": [1]}}, "`at` must map"),
    ],
)
def test_bad_records_are_user_errors(kwargs, words):
    with pytest.raises(UserError, match=words):
        make_record(**kwargs)


def test_record_outside_a_kernel_prints_a_summary(capsys):
    perfkit.record("mask_build", [0.1, 0.2, 0.3] * 5, unit="ms", at={"ctx": 4096}, note="hello")
    out = capsys.readouterr().out
    assert out.startswith("perfkit record mask_build [ctx=4096]: 0.2 ms [")
    assert "n=15" in out and "note: hello" in out


def test_record_with_no_samples_says_so(capsys):
    perfkit.record("silent", [], unit="ms")
    assert "NO SAMPLES" in capsys.readouterr().out


def test_record_in_a_kernel_displays_a_bundle_the_runner_reads_back(monkeypatch):
    shown = []

    class Shell:
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw: shown.append(bundle))
    perfkit.record("t", [1.0, 2.0, math.nan], unit="s", at={"batch": 8})
    (bundle,) = shown
    assert "perfkit record t [batch=8]" in bundle["text/plain"]
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)  # through the file format
    (record,) = records_in(nb)
    assert record.name == "t" and record.unit == "s" and record.at == {"batch": 8}
    assert record.samples[:2] == (1.0, 2.0) and math.isnan(record.samples[2])
    assert bundle[MIMETYPE]["format_version"] == 1


def test_record_breakdown_from_a_capture(monkeypatch):
    from perfkit.probe.spans import capture, span

    with capture() as cap:
        for _ in range(6):
            with span(STEP):
                with span("draft"):
                    time.sleep(0.001)
                with span("verify_forward"):
                    time.sleep(0.002)
                time.sleep(0.001)  # in no phase: must land in unattributed
    shown = []
    import perfkit.probe.recording as probe

    monkeypatch.setattr(probe, "_emit", lambda records, text: shown.append((records, text)))
    perfkit.record_breakdown(cap, unit="ms", at={"ctx": 1})
    ((records, text),) = shown
    by_name = {r["name"]: decode_samples(r["samples"]) for r in records}
    assert list(by_name) == [STEP, *BREAKDOWN]
    assert all(r["breakdown"] == STEP and r["unit"] == "ms" and r["at"] == {"ctx": 1} for r in records)
    assert all(len(v) == 6 for v in by_name.values())
    assert by_name["tree_build"] == [0.0] * 6  # a phase that never ran is zero, not missing
    for i in range(6):
        parts = sum(by_name[p][i] for p in PHASES) + by_name[UNATTRIBUTED][i]
        assert parts == pytest.approx(by_name[STEP][i])
        assert by_name[UNATTRIBUTED][i] >= 0.9  # the 1 ms outside any phase
    assert "unattributed" in text and "of step" in text


def test_record_breakdown_rejects_a_non_time_unit():
    with pytest.raises(UserError, match="time unit"):
        perfkit.record_breakdown([{"step": 1.0}], unit="B")
