"""The engine's server room: `perfkit engine serve`, the bundled engine behind an OpenAI-compatible
HTTP API. `app` (the HTTP server and its scheduler) asks `workers` (the parent's side of the rank
processes) for each batch; each rank process runs `rank`, holding its tensor-parallel shard (`tp`);
the two ends of the pipe speak `messages`; `api` reads and checks what a request asks for.

It imports the model room (perfkit/engine's own modules) and nothing of training or benchmarks.
"""
