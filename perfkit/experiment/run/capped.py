"""The papermill engine `perfkit run` executes probes with: a probe's output is stored up to a cap.

A probe that prints a gigabyte must neither fill the disk nor the memory of the process that
records it. Its kernel already cuts its stdout and stderr past the cap (perfkit.experiment.run.kernel,
PERFKIT_OUTPUT_CAP); here what still arrives is stored until the cap, the message that crosses it
kept up to the cap (never dropped whole), the rest replaced by one note per cell saying how much
was cut. Records and tracebacks are evidence and are never cut. And the wait for a cell's last
output after it finished (nbclient's iopub timeout, 4 s) is made long and never fatal: a flood
that takes a while to drain is not a cell that timed out.

The kernel talks to this process over Unix sockets in a directory of its own, not TCP ports:
jupyter_client picks free ports by binding and releasing them, so two kernels starting at once
can be handed the same port and one dies before it answers (papermill#511; seen as "Kernel died
before replying to kernel_info" on a 2-core CI machine running probes in parallel).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from perfkit.samples import MIMETYPE

IOPUB_WAIT_S = 120.0  # after a cell finished, how long its remaining output may take to arrive


def client(cap: int):
    """papermill's notebook client, storing at most `cap` characters of a probe's output, with a note of the cut."""
    from nbformat.v4 import new_output
    from papermill.clientwrap import PapermillNotebookClient

    class CappedClient(PapermillNotebookClient):
        def __init__(self, *args, sockets: Path, **kwargs):
            super().__init__(*args, **kwargs)
            self.sockets = sockets  # where the kernel's Unix sockets go
            self.iopub_timeout = max(self.iopub_timeout, IOPUB_WAIT_S)
            self.raise_on_iopub_timeout = False  # late output is late, not a timeout of the cell
            self.kept = 0  # characters stored so far
            self.cut: dict[int, int] = {}  # cell index -> characters cut
            self.notes: dict[int, object] = {}  # cell index -> the note saying so

        def create_kernel_manager(self):
            km = super().create_kernel_manager()
            km.transport = "ipc"  # no ports to race for (the module's docstring)
            km.ip = str(self.sockets / "kernel")
            return km

        def output(self, outs, msg, display_id, cell_index):
            content = msg.get("content", {})
            data = content.get("data") or {}
            if msg["msg_type"] == "error" or MIMETYPE in data:  # evidence and tracebacks are never cut
                return super().output(outs, msg, display_id, cell_index)
            size = len(content.get("text", "")) + sum(len(str(v)) for v in data.values())
            if self.kept + size <= cap:
                self.kept += size
                return super().output(outs, msg, display_id, cell_index)
            room = cap - self.kept
            if msg["msg_type"] == "stream" and room > 0:  # the message that crosses the cap: keep its start
                self.kept = cap
                super().output(
                    outs, {**msg, "content": {**content, "text": content["text"][:room]}}, display_id, cell_index
                )
                size -= room
            self._note(outs, cell_index, size)
            return None

        def _note(self, outs, cell_index: int, size: int) -> None:
            self.cut[cell_index] = self.cut.get(cell_index, 0) + size
            text = (
                f"[perfkit: {self.cut[cell_index]:,} characters of this cell's output were cut: a probe's stored "
                f"output is capped at {cap // 2**20} MiB]\n"
            )
            note = self.notes.get(cell_index)
            if note is None or not any(o is note for o in outs):
                note = new_output("stream", name="stderr", text=text)
                outs.append(note)
                self.notes[cell_index] = note
            else:
                note["text"] = text

    return CappedClient


def engine(cap: int):
    """A papermill engine that runs the notebook with the capped client."""
    from papermill.engines import NBClientEngine, logger

    capped_client = client(cap)

    class CappedEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, start_timeout=60, **kwargs):
            sockets = Path(tempfile.mkdtemp(prefix="perfkit-kernel-"))  # short: a socket's path has a 107-byte limit
            try:
                return capped_client(
                    nb_man, kernel_name=kernel_name, startup_timeout=start_timeout, log=logger, sockets=sockets
                ).execute()
            finally:
                shutil.rmtree(sockets, ignore_errors=True)

    return CappedEngine
