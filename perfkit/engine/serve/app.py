"""`perfkit engine serve`: the bundled engine behind an OpenAI-compatible HTTP API (Starlette + uvicorn).

    perfkit engine serve --tp 2 --preset shipped --port 8000
    -> perfkit engine serve: ready at http://127.0.0.1:8000 (tp 2, ranks pid 123 rank 0, pid 124 rank 1)
Routes: GET /health (200 {"status": "ok"} when ready; 503 with the reason while the ranks load or
after one died), GET /v1/models (one model, "perfkit-<preset>"; its "perfkit" member is the engine's
identity: preset, tp, mode, budget, mask, tree, device, dtype, fill, threads, version, commit (of
the perfkit source when it is a git checkout, `-dirty` when its perfkit/ has changes, else null),
max_model_len, and, new on every start, "pids" (the ranks) and "server_pid"), GET /stats (batches,
requests, largest_batch, queued), GET /metrics (Prometheus, named as vLLM's: perfkit.engine.serve.metrics),
POST /tokenize, POST /v1/completions, POST /v1/chat/completions.
Every response has an `x-perfkit-engine` header.

What a request may ask for, its defaults and the chat template: perfkit.engine.serve.api. Generation
runs to max_tokens (finish_reason "length").
A stream has a chunk per decode step (a speculative step's carries all its tokens) or, with --chunk
token, per token, never splitting a UTF-8 character; the last has the finish_reason; a usage-only
chunk (choices []) follows with stream_options.include_usage; with continuous_usage_stats too every
chunk has the running usage (as vLLM); then `data: [DONE]`. A chat stream starts with a role-only
chunk. An error once streaming is a `data: {"error": ...}` frame, then [DONE]; before, an
OpenAI-shaped error with its HTTP status.

Requests queue, and one thread batches them into generations (perfkit.engine.serve.scheduler).
SIGTERM or SIGINT: requests get 503, the ranks are closed (they exit normally: PERFKIT_PROFILE
summaries print to this server's stderr), and the process exits 0. With PERFKIT_SERVE_PARENT=pid
(perfkit.serving sets it), the server also stops when that process is gone. SIGUSR1 asks the
ranks for their profile lines at once (with PERFKIT_PROFILE; ignored otherwise).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

from perfkit import environment
from perfkit.engine import data
from perfkit.engine.serve.api import Failure, chat_prompt, params, prompt_tokens
from perfkit.engine.serve.metrics import CONTENT_TYPE, ServerMetrics
from perfkit.engine.serve.scheduler import Job, Scheduler
from perfkit.engine.serve.workers import Workers
from perfkit.engineoptions import EngineOptions
from perfkit.errors import UserError
from perfkit.paths import PACKAGE_HOME, git_try

__all__ = ["serve", "CREATED"]

CREATED = 1735689600  # the model's "created": fixed, so that the identity does not change between starts
STARTUP_TIMEOUT_S = 600.0


def _deps():
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        message = "perfkit engine serve needs Starlette, uvicorn and prometheus_client: pip install 'perfkit[serve]'"
        raise UserError(message) from None
    return uvicorn


class State:
    """The workers, the scheduler and what the routes need to know about them."""

    def __init__(self, args, workers: Workers):
        self.args, self.workers = args, workers
        self.scheduler = Scheduler(workers, max_batch=args.max_batch, wait_s=args.batch_wait_ms / 1e3)
        self.model = f"perfkit-{workers.options.preset}"
        self.metrics = ServerMetrics(
            self.model, running=lambda: self.scheduler.running, waiting=lambda: len(self.scheduler.queue)
        )
        self.scheduler.metrics = self.metrics
        self.status = "loading"  # loading | ready | failed | stopping
        self.reason = ""
        self.exit_code = 0
        self.server = None  # the uvicorn.Server, to stop it when the ranks fail to start
        self._closer: threading.Thread | None = None
        root = PACKAGE_HOME
        git = git_try(root, "rev-parse", "--show-toplevel", "HEAD")
        lines = git.stdout.split() if git is not None and git.returncode == 0 else []
        self.commit = lines[1] if len(lines) == 2 and Path(lines[0]).resolve() == root else None
        edited = git_try(root, "status", "--porcelain", "--", "perfkit") if self.commit else None
        if edited is not None and edited.stdout.strip():
            self.commit += "-dirty"  # the engine's source differs from that commit: not the same server

    def engine(self) -> dict:
        max_len = self.workers.limits.get("max_seq_len")
        info = dict(self.workers.identity, commit=self.commit, max_model_len=max_len)
        return {**info, "pids": self.workers.pids, "server_pid": os.getpid()}

    def json(self, body: dict, status: int = 200):
        """A JSON response with the x-perfkit-engine header (version, preset, tp, mode), as every response has."""
        from starlette.responses import JSONResponse

        return JSONResponse(body, status, headers=self.headers())

    def headers(self) -> dict:
        i = self.workers.identity
        return {"x-perfkit-engine": f"perfkit/{i['version']} preset={i['preset']} tp={i['tp']} mode={i['mode']}"}

    def unavailable(self) -> str | None:
        """Why requests are refused now (503), None when the engine serves."""
        if self.status == "ready":
            return self.workers.dead
        return {"stopping": "the server is shutting down", "loading": "the engine is still loading"}.get(
            self.status, f"the engine failed to start: {self.reason}"
        )

    def start_up(self) -> None:
        """In a thread: wait for the ranks, then serve, or say why not and stop the server."""
        try:
            self.workers.wait_ready(STARTUP_TIMEOUT_S)
        except Exception as exc:
            if self.status != "stopping":
                self.status, self.reason, self.exit_code = "failed", str(exc), 1
                print(f"perfkit engine serve: the engine failed to start: {exc}", file=sys.stderr, flush=True)
                if self.server is not None:
                    self.server.should_exit = True
            return
        self.scheduler.thread.start()
        self.status = "ready"
        ranks = ", ".join(f"pid {pid} rank {rank}" for rank, pid in enumerate(self.workers.pids))
        url = f"http://{self.args.host}:{self.args.port}"
        print(f"perfkit engine serve: ready at {url} (tp {self.workers.tp}, ranks {ranks})", flush=True)

    def stop(self) -> None:
        """Refuse requests, fail the queued ones, close the ranks (in a thread: this may be a signal handler)."""
        if self._closer is not None:
            return
        self.status = "stopping"
        self.scheduler.stop("the server is shutting down")
        self._closer = threading.Thread(target=self.workers.close, name="perfkit-close", daemon=True)
        self._closer.start()

    def join(self) -> None:
        self.stop()
        self._closer.join()
        if self.scheduler.thread.is_alive():  # ends with the queue (its generate fails once the ranks are closed)
            self.scheduler.thread.join(5)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Reply:
    """The response objects of one completion request (non-streamed and streamed chunks)."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int):
        self.model, self.chat, self.prompt = model, chat, prompt_tokens
        self.id, self.created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())

    def _object(self, kind: str, choices: list, usage: dict | None) -> dict:
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        return out if usage is None else {**out, "usage": usage}

    def whole(self, tokens: list[int]) -> dict:
        text = data.decode(tokens)
        choice = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        choice = {"index": 0, **choice, "logprobs": None, "finish_reason": "length"}
        kind = "chat.completion" if self.chat else "text_completion"
        return self._object(kind, [choice], _usage(self.prompt, len(tokens)))

    def chunk(self, text: str | None, finish: str | None = None, usage: dict | None = None, *, role=False) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": text} if text or not finish else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return _frame(self._object(kind, [choice] if text is not None else [], usage))


def _frame(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _stream(reply: Reply, job: Job, first: tuple, p: dict, per_token: bool):
    """The SSE frames of a streamed completion, from its first event on."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    count, event = 0, first
    running = (lambda: _usage(reply.prompt, count)) if p["continuous"] else (lambda: None)
    if reply.chat:
        yield reply.chunk("", usage=running(), role=True)
    while event[0] == "tokens":
        for piece in [[t] for t in event[1]] if per_token else [event[1]]:
            count += len(piece)
            text = decoder.decode(bytes(piece))
            if text:
                yield reply.chunk(text, usage=running())
        event = await job.events.get()
    if event[0] == "done":
        yield reply.chunk(decoder.decode(b"", final=True), "length", running())
        if p["include_usage"]:
            yield reply.chunk(None, usage=_usage(reply.prompt, count))
    else:
        yield _frame(Failure(event[1], event[2]).body())
    yield "data: [DONE]\n\n"


async def _body(request) -> dict:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise Failure(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested thousands deep: the client's fault, not the server's
        raise Failure(400, "the request body is not valid JSON: nested too deep") from None
    if not isinstance(body, dict):
        raise Failure(400, "the request body must be a JSON object")
    return body


def _check_model(state: State, body: dict) -> None:
    model = body.get("model")
    if model is not None and model not in (state.model, state.workers.options.preset):
        raise Failure(404, f"The model `{model}` does not exist; this server has `{state.model}`", "model")


async def _complete(request, chat: bool):
    from starlette.responses import StreamingResponse

    state: State = request.app.state.perfkit
    clock = state.metrics.arrived()
    body = await _body(request)
    _check_model(state, body)
    p = params(body, chat)
    why = state.unavailable()
    if why is not None:
        raise Failure(503, why)
    longest = state.workers.max_prompt_tokens(p["max_tokens"])
    if len(p["tokens"]) > longest:
        limit = state.workers.limits["max_seq_len"]
        message = f"the prompt ({len(p['tokens'])} tokens) and max_tokens {p['max_tokens']} do not fit the model's "
        raise Failure(400, message + f"{limit} positions: at most {max(longest, 0)} prompt tokens with this max_tokens")
    job = Job(p["tokens"], p["max_tokens"], p["temperature"], p["seed"], clock)
    state.scheduler.submit(job)
    first = await job.events.get()
    if first[0] == "error":
        raise Failure(first[1], first[2])
    reply = Reply(state.model, chat, len(p["tokens"]))
    if p["stream"]:
        frames = _stream(reply, job, first, p, state.args.chunk == "token")
        headers = {"Cache-Control": "no-cache", **state.headers()}
        return StreamingResponse(frames, media_type="text/event-stream", headers=headers)
    tokens, event = [], first
    while event[0] == "tokens":
        tokens += event[1]
        event = await job.events.get()
    if event[0] == "error":
        raise Failure(event[1], event[2])
    return state.json(reply.whole(tokens))


def _app(state: State):
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    async def health(request):
        why = state.unavailable()
        body = {"status": "ok"} if why is None else {"status": state.status, "reason": why}
        return state.json(body, 200 if why is None else 503)

    async def models(request):
        card = {"id": state.model, "object": "model", "created": CREATED, "owned_by": "perfkit"}
        card.update(
            root=state.workers.options.preset, parent=None, max_model_len=state.workers.limits.get("max_seq_len")
        )
        return state.json({"object": "list", "data": [{**card, "perfkit": state.engine()}]})

    async def metrics(request):
        from starlette.responses import Response

        return Response(state.metrics.text(), headers={"Content-Type": CONTENT_TYPE, **state.headers()})

    async def stats(request):
        return state.json(dict(state.scheduler.counts, queued=len(state.scheduler.queue)))

    async def tokenize(request):
        body = await _body(request)
        _check_model(state, body)
        if body.get("messages") is not None:
            tokens = data.encode(chat_prompt(body["messages"]))
        else:
            tokens = prompt_tokens(body.get("prompt", body.get("text")))
        max_len = state.workers.limits.get("max_seq_len")
        return state.json({"tokens": tokens, "count": len(tokens), "max_model_len": max_len})

    async def failed(request, exc):
        if isinstance(exc, HTTPException):
            exc = Failure(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        elif not isinstance(exc, Failure):
            exc = Failure(500, f"{type(exc).__name__}: {exc}")
        return state.json(exc.body(), exc.status)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.workers.start()
        threading.Thread(target=state.start_up, name="perfkit-start-up", daemon=True).start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.join)

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/stats", stats),
        Route("/metrics", metrics),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/completions", functools.partial(_complete, chat=False), methods=["POST"]),
        Route("/v1/chat/completions", functools.partial(_complete, chat=True), methods=["POST"]),
    ]
    handlers = {HTTPException: failed, Failure: failed, Exception: failed}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.perfkit = state
    return app


def serve(args) -> int:
    """Run the server until SIGTERM or SIGINT (exit status 0), or until the ranks fail to start (1)."""
    uvicorn = _deps()
    state = State(args, Workers(EngineOptions.from_args(args)))

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.stop()
            super().handle_exit(sig, frame)

    app = _app(state)
    config = uvicorn.Config(app, args.host, args.port, log_level="warning", access_log=False, lifespan="on")
    config.timeout_graceful_shutdown = 5
    state.server = Server(config)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal it stopped on: let it pass
        signal.signal(sig, lambda *_: None)
    _exit_with(environment.count_or_none("PERFKIT_SERVE_PARENT", high=2**31 - 1))
    _pass_on_reports(state.workers)
    try:
        state.server.run()
    finally:
        state.join()
    return state.exit_code


def _pass_on_reports(workers: Workers) -> None:
    """SIGUSR1 (`kill -USR1`, `systemctl kill -s USR1`) asks the ranks for their profile lines now,
    when they profile (PERFKIT_PROFILE in this environment, which they inherit); else it is ignored,
    never the end of the server or of a rank that has no handler for it."""
    from perfkit.probe import spans

    if not spans.enabled():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        return

    def ask(*_):
        if not workers.loaded:  # a rank still importing has no handler yet: the signal would end it
            return
        for pid in workers.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, ask)


def _exit_with(parent: int | None) -> None:
    """SIGTERM this server when process `parent` is gone (PERFKIT_SERVE_PARENT: the probe that started
    it, in a session of its own, so nothing else stops it when that probe's kernel is killed)."""
    if parent is None:
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="perfkit-serve-parent", daemon=True).start()
