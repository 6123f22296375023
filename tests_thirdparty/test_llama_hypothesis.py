"""A hypothesis on llama.cpp's own counters, judged by `perfkit run` against a llama-server it did not start.

llama-server exports counters, not histograms (`llamacpp:tokens_predicted_total`, `..._seconds_total`):
its own decode rate over a window is the one grown by the other. A probe of the "user's" records it per
replicate, each replicate a window of requests on the one server process (make test-thirdparty; CI runs it).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

PROBE = """\
import perfkit
from perfkit import serving

window = serving.metrics_window(server_url)
results = serving.run(server_url, context=64, gen=24, requests=5, seed=replicate, window=window)
assert all(r.ok for r in results), [r.error for r in results]
names = ("llamacpp:tokens_predicted", "llamacpp:tokens_predicted_seconds")
grown = {name: sum(window.counter(name).values()) for name in names}
rate = grown[names[0]] / grown[names[1]]
perfkit.record("server_decode_tok_s", [rate], unit="tok/s", note=f"llama.cpp's own counters over the window: {grown}")
"""
HYPOTHESIS = """\
id: llama-decodes-at-least-10-tok-s
claim: llama.cpp's own counters say the tiny model decodes at least 10 tokens a second
rationale: a 2-layer model of width 128 decodes thousands of tokens a second on one CPU thread
expect: {kind: at_least, metric: server_decode_tok_s, value: 10, unit: tok/s, min_samples: 1}
probe:
  notebook: llama.ipynb
  params: {server_url: URL}
"""


def _project(root: Path, url: str):
    from perfkit.paths import Project

    (root / "notebooks").mkdir()
    (root / "hypotheses").mkdir()
    params = 'server_url: str = ""\nreplicate: int = 0'
    cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell(PROBE)]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=kernel), str(root / "notebooks" / "llama.ipynb"))
    (root / "hypotheses" / "llama-decodes-at-least-10-tok-s.yaml").write_text(HYPOTHESIS.replace("URL", url))
    return Project(root)


def test_a_hypothesis_on_llama_cpps_own_counters_is_judged_over_windows_of_its_one_process(
    server, tmp_path, monkeypatch
):
    from perfkit.experiment.run import runner, schedule
    from perfkit.experiment.run.options import RunOptions

    project = _project(tmp_path, server.url)
    monkeypatch.setattr(runner, "source_tree_hash", lambda: "fixed-source")
    monkeypatch.setattr(schedule.fitness, "unfit", lambda trace, window=None, limits=None: None)  # other work here
    options = RunOptions(ids=("llama-decodes-at-least-10-tok-s",), replicates=3, max_replicates=3, timeout_s=300)
    report = runner.run(project, options, out=print)
    (h,) = report.results.hypotheses
    assert h.verdict == "confirmed", h.reason
    assert h.measured.unit == "tok/s" and h.measured.low > 10 and h.measured.replicates == 3
    assert all(x.server["model"] == "perfkit-tiny-llama" and x.server_instance for x in h.executions)
    # llama-server says neither a start time nor its pids: perfkit says a restart could not be told
    (said,) = [w for w in h.warnings if "windows of requests on the running server" in w]
    assert "cannot be told" in said and server.url in said
    assert "each replicate a window of requests on that running server" in project.ledger_path.read_text()
