"""AIPerf, an established serving benchmark client, measures the same workload perfkit.serving does
(client_agreement.py: the timing comparison is a benchmark, `make bench-clients`; here what must
hold on any machine, loaded or not: both clients see the same requests, tokens and prompts)."""

from __future__ import annotations

import pytest
from client_agreement import AIPERF, CONTEXT, GEN, aiperf_export, perfkit_side, targets

if not AIPERF.exists():
    pytest.skip(f"no aiperf at {AIPERF} (`make test-thirdparty` installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def found():
    with targets() as servers:
        yield servers


def test_aiperf_and_perfkit_serving_count_the_same_requests_and_tokens(found, tmp_path):
    for t in found:
        got = aiperf_export(t, concurrency=2, requests=4, seed=7, work=tmp_path)
        assert got["request_count"]["avg"] == 4 and not got.get("error_summary")
        assert got["output_sequence_length"]["min"] == got["output_sequence_length"]["max"] == GEN, t.name
        if t.model == "perfkit-shipped":  # a byte vocabulary: the prompt is exactly CONTEXT tokens
            assert got["input_sequence_length"]["min"] == got["input_sequence_length"]["max"] == CONTEXT
        ours = perfkit_side(t, concurrency=2, requests=4, seed=7)
        assert all(v > 0 for k, v in ours.items() if k != "itl_chunk_ms"), ours
        for figure in ("time_to_first_token", "inter_token_latency", "output_token_throughput"):
            assert got[figure]["avg"] > 0, (t.name, figure)
