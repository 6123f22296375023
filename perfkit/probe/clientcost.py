"""What perfkit.serving's stream reader costs per frame, measured beside a bare aiohttp read of the same
streams (`perfkit.serving.overhead`, and `perfkit overhead --serving`): the client's own share of
what it times, said in one line.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from perfkit.errors import UserError
from perfkit.probe.streams import Target, load_aiohttp, request, run_sync, served_model
from perfkit.probe.workload import make_prompts

__all__ = ["overhead"]


async def _bare(session, target: Target, prompt: str, meter: dict[str, float]) -> None:
    """The same request read by a bare aiohttp loop that only counts `data:` lines."""
    http = load_aiohttp()
    cpu = time.thread_time()
    async with session.post(
        target.endpoint, json=target.body(prompt), timeout=http.ClientTimeout(total=target.timeout)
    ) as response:
        if response.status != 200:
            raise UserError(f"serving.overhead: HTTP {response.status} from {target.endpoint}")
        async for line in response.content:
            t = time.perf_counter()
            if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                meter["frames"] += 1
            meter["handling"] += time.perf_counter() - t
    meter["cpu"] += time.thread_time() - cpu


def overhead(
    url: str, *, requests: int = 8, gen: int = 64, context: int = 64, chat: bool = False, model: str | None = None
) -> dict[str, Any]:
    """This client's own cost per frame beside a bare aiohttp read of the same streams, in one run.

    Each of `requests` prompts is sent twice, one at a time: read by run()'s reader and by a loop
    that only counts `data:` lines, alternating which goes first. Per reader: the frames read, this
    thread's CPU time per frame and the time spent on the lines themselves per frame (us);
    `overhead_us_per_frame` is the difference in CPU per frame; `text` says it all in one line.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise UserError(f"serving.overhead: requests must be a positive integer, got {requests!r}")
    url = url.rstrip("/")
    model = model or served_model(url)
    prompts = make_prompts(requests, context, tag=uuid.uuid4().hex[:6])
    http = load_aiohttp()
    client = {"frames": 0.0, "chunks": 0.0, "cpu": 0.0, "handling": 0.0}
    bare = {"frames": 0.0, "cpu": 0.0, "handling": 0.0}

    async def go() -> None:
        async with http.ClientSession(connector=http.TCPConnector(limit=2)) as session:
            target = Target(url, model, chat, gen, 600, 0)
            for i, prompt in enumerate(prompts):
                for reader in ("client", "bare") if i % 2 == 0 else ("bare", "client"):
                    if reader == "bare":
                        await _bare(session, target, prompt, bare)
                        continue
                    stream = await request(session, target, prompt, meter=client)
                    if stream.error:
                        raise UserError(f"serving.overhead: request {i} failed: {stream.error}")
                    client["frames"] += stream.frames
                    client["chunks"] += len(stream.chunks)

    run_sync(go)

    def per_frame(m: dict[str, float]) -> dict[str, float]:
        frames = max(m["frames"], 1.0)
        return {
            "frames": int(m["frames"]),
            "cpu_us_per_frame": m["cpu"] / frames * 1e6,
            "handling_us_per_frame": m["handling"] / frames * 1e6,
        }

    out: dict[str, Any] = {"requests": requests, "client": per_frame(client), "bare": per_frame(bare)}
    out["client"]["text_chunks"] = int(client["chunks"])
    out["overhead_us_per_frame"] = out["client"]["cpu_us_per_frame"] - out["bare"]["cpu_us_per_frame"]
    c, b = out["client"], out["bare"]
    out["text"] = (
        f"perfkit.serving reads a frame in {c['cpu_us_per_frame']:.1f} us of CPU ({c['handling_us_per_frame']:.1f} us "
        f"in its own rules), a bare aiohttp read in {b['cpu_us_per_frame']:.1f} us ({b['handling_us_per_frame']:.1f}"
        f" us); {c['frames']} and {b['frames']} frames of {requests} requests each"
    )
    return out
