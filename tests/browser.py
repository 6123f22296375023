"""A real headless browser (Debian's chromium) for the tests that look at a page as a reader would:
the report, GitHub's rendering of the ledger. CI installs it (.ci/run); elsewhere the tests skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def browser_dom(page: Path, screenshot: Path | None = None) -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (.ci/run installs it)")
        pytest.skip("no chromium here: `apt-get install chromium` to run the browser test")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    if screenshot is not None:
        subprocess.run(
            [CHROMIUM, *flags, "--window-size=1280,900", f"--screenshot={screenshot}", page.as_uri()],
            capture_output=True,
            timeout=120,
            check=True,
        )
    done = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout
