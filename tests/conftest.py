"""Shared fixtures."""

import os
import sys
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def ctrl_c_stays_ctrl_c():
    """Every test leaves SIGINT's handler as it found it: a handler left behind (dask-jobqueue 0.9.0 sets
    one that exits on import) turns a later test's Ctrl-C into SystemExit, far from its cause."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT's handler changed ({after!r}); restore it")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from a second thread and lose a lot when the other core is busy."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> dict[str, str]:
    """A fresh virtual environment with perfkit pip-installed (not editable): the environment to run it in.

    Its dependencies come from this checkout's .venv through a .pth file: nothing is downloaded."""
    from repos import ROOT, sh

    venv = tmp_path_factory.mktemp("venv") / "v"
    sh(ROOT, sys._base_executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    purelib = Path(
        sh(ROOT, str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    (purelib / "perfkit-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh(ROOT, str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(ROOT))
    where = sh(venv, str(python), "-c", "import perfkit; print(perfkit.__file__)").stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed copy, not this checkout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFKIT_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg")
    return env | {"_purelib": str(purelib)}
