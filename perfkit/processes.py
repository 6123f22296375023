"""Whether a process is still there: the one check the run, its executors, bisect and the probes' servers
share (a zombie is gone: it ran to its end and only waits for its parent to read its status)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (another user's process counts: it exists)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
