"""Issue 47: the signed cache of results files read (perfkit/experiment/records/readcache.py) gives what
reading the files gives, follows every change to them, and never unpickles what this user did not sign."""

from __future__ import annotations

import os
import pickle

import pytest
from records import result, store

from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import readcache, results
from perfkit.paths import Project


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "user-cache"))
    monkeypatch.setattr(results, "CACHED_FROM", 3)
    (tmp_path / "hypotheses").mkdir()
    project = Project(tmp_path)
    for i in range(5):
        store(project, f"20260101-00000{i}", result("h", "confirmed", value=1.0 + i / 10, run_id=f"r{i}"))
    return project


def _uncached(project: Project, monkeypatch) -> list:
    with monkeypatch.context() as m:
        m.setattr(results, "CACHED_FROM", 10**9)
        return results.load_all_results(project)


def test_the_cache_gives_what_the_files_give_and_the_same_ledger(project, monkeypatch):
    first = results.load_all_results(project)  # reads the files, writes the cache
    cache = project.runs_dir / ".cache" / "results.pickle"
    assert cache.is_file()
    again = results.load_all_results(project)  # from the cache
    assert again == first == _uncached(project, monkeypatch)
    assert ledger.render(again) == ledger.render(_uncached(project, monkeypatch))
    key = project.root / "user-cache" / "cache.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == readcache.KEY_BYTES


def test_a_changed_added_or_removed_results_file_is_read_again(project, monkeypatch):
    results.load_all_results(project)
    store(project, "20260101-000002", result("h", "refuted", value=9.0, run_id="r2"))  # rewritten in place
    store(project, "20260101-000009", result("h", "confirmed", value=2.0, run_id="r9"))
    (project.results_dir / "20260101-000000.json").unlink()
    got = results.load_all_results(project)
    assert got == _uncached(project, monkeypatch)
    assert [r.run_id for r in got][:2] == ["20260101-000001", "20260101-000002"]
    assert got[1].hypotheses[0].verdict == "refuted" and got[-1].run_id == "20260101-000009"


class _Payload:
    def __reduce__(self):
        return (os.mkdir, ("/tmp/perfkit-unpickled-" + str(os.getpid()),))


def test_a_cache_this_user_did_not_sign_is_never_unpickled(project, monkeypatch):
    results.load_all_results(project)
    cache = project.runs_dir / ".cache" / "results.pickle"
    forged = pickle.dumps((readcache._code(), {"x": ((0, 0, 0), _Payload())}))
    for blob in (b"\0" * 32 + forged, forged, b"", b"short"):
        cache.write_bytes(blob)
        assert results.load_all_results(project) == _uncached(project, monkeypatch)
        assert not os.path.exists("/tmp/perfkit-unpickled-" + str(os.getpid()))
    # signed by another key: the same
    (project.root / "user-cache" / "cache.key").write_bytes(b"k" * readcache.KEY_BYTES)
    os.chmod(project.root / "user-cache" / "cache.key", 0o600)
    assert results.load_all_results(project) == _uncached(project, monkeypatch)


def test_a_key_others_can_read_is_replaced_and_no_key_means_no_cache(project, monkeypatch, tmp_path):
    results.load_all_results(project)
    key = project.root / "user-cache" / "cache.key"
    os.chmod(key, 0o644)
    before = key.read_bytes()
    results.load_all_results(project)
    assert key.read_bytes() != before and key.stat().st_mode & 0o777 == 0o600
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "not-a-folder" / "below"))
    (project.runs_dir / ".cache" / "results.pickle").unlink()
    assert results.load_all_results(project) == _uncached(project, monkeypatch)  # every file read
    assert not (project.runs_dir / ".cache" / "results.pickle").exists()
