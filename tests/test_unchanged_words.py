"""A measurement that did not move is said to be unchanged: never '2.22e-14% higher' (issue 34, item 4)."""

from dataclasses import replace

from records import result, run_results

from perfkit.experiment.records import compare
from perfkit.experiment.records.results import Measured


def tokens(value: float) -> Measured:
    """accept-length-at-least-2-5's measurement: 8.875 tokens a step in every process, an interval of width 0."""
    return Measured(label="mean", unit="tok", value=value, low=value, high=value, replicates=3)


def test_the_same_tokens_summed_in_another_order_are_unchanged_and_identical():
    then = result("accept", "confirmed", measured=tokens(8.875))
    now = result("accept", "confirmed", measured=tokens(8.875000000000002), run_id="r2")  # the last bit differs
    assert compare.move(then, now) == (None, None)
    assert compare.moved_from(then, now) == "unchanged (8.88 tok, identical)"
    assert compare.move_words(1 + 2.2e-16, None) == ""  # a factor of 1 down to the rounding says nothing
    runs = [run_results("r1", then), run_results("r2", now)]
    (change,) = compare.compare(runs[:1], runs)
    assert change.kind == "unchanged" and change.factor is None


def test_a_real_move_and_a_move_inside_the_noise_keep_their_words():
    then = result("t", "confirmed", 0.258, width=0.12)
    assert compare.moved_from(then, result("t", "refuted", 0.567, run_id="r2", width=0.2)).startswith(
        "2.2x higher than 0.258 ms ["
    )
    assert compare.moved_from(then, result("t", "confirmed", 0.26, run_id="r2")).startswith("within the noise of")
    tiny = replace(tokens(8.875), value=8.876, low=8.876, high=8.876)  # a real move, however small: said
    said = compare.moved_from(result("a", "confirmed", measured=tokens(8.875)), result("a", "confirmed", measured=tiny))
    assert said == "0.0113% higher than 8.88 tok [8.88, 8.88]"


def test_a_stored_note_that_called_rounding_a_move_reads_unchanged_once_upgraded():
    """Results before format 10 could word a rounding error as a move; the upgrade says it as perfkit now
    does, and leaves a real move (or a small but real one) as it was."""
    from perfkit.experiment.records.formats import UPGRADES

    def upgraded(note: str) -> str:
        return UPGRADES[9]({"hypotheses": [{"changed": note, "executions": []}]})["hypotheses"][0]["changed"]

    assert upgraded("changed: x: 2.22e-14% higher than 8.88 tok [8.88, 8.88]") == (
        "changed: x: unchanged (8.88 tok, identical)"
    )
    assert upgraded("changed: x: 12% higher than 3 ms [2.9, 3.1]") == "changed: x: 12% higher than 3 ms [2.9, 3.1]"
    assert upgraded("a: 1.5e-3% lower than 3 ms [2, 4]") == "a: 1.5e-3% lower than 3 ms [2, 4]"
