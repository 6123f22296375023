"""Records that try to take the reviewer's machine down are refused quickly, as file:line: message."""

import time

import pytest

from perfkit.cli import main

GOOD = """id: {id}
claim: The work is fast.
rationale: Because.
expect: {{kind: at_most, metric: t, unit: ms, value: 1}}
probe: {{notebook: p.ipynb}}
"""

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
)

CASES = {
    "billion-laughs": (BOMB, 1, "anchors and aliases"),  # the first anchor, before anything expands
    "recursive-alias": ("id: &x [*x]\n", 1, "anchors and aliases"),
    "python-tag": ("id: !!python/name:os.system x\n", 1, "tags are not allowed"),
    "unknown-tag": ("id: !mine x\n", 1, "tags are not allowed"),
    "merge-key": ("base: {a: 1}\nid: x\n<<: {claim: c}\n", 3, "merge keys"),
    "list-key": ("? [a, b]\n: 1\n", 1, "keys must be plain names"),
    "deep": ("id: " + "[" * 30 + "]" * 30 + "\n", 1, "nested deeper than"),
    "huge-int": (
        "id: x\nclaim: c\nrationale: r\nexpect: {kind: at_most, metric: t, unit: ms, value: 1"
        + "0" * 5000
        + "}\nprobe: {notebook: p.ipynb}\n",
        4,
        "cannot read this value",
    ),
}


def project(tmp_path, name, text):
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses" / f"{name}.yaml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_record_is_refused_quickly_with_file_and_line(tmp_path, capsys, name):
    text, line, message = CASES[name]
    root = project(tmp_path, name, text)
    started = time.monotonic()
    assert main(["--root", str(root), "validate"]) == 2
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert f"hypotheses/{name}.yaml:{line}: " in err and message in err, err
    assert "Traceback" not in err
    assert elapsed < 5  # well under a second here; the bound only catches an explosion


def test_a_record_larger_than_a_record_needs_is_refused_before_it_is_read(tmp_path, capsys):
    root = project(tmp_path, "big", GOOD.format(id="big") + "# " + "x" * 1_100_000 + "\n")
    assert main(["--root", str(root), "validate"]) == 2
    assert "hypotheses/big.yaml: the record is larger than 1,000,000 bytes" in capsys.readouterr().err
