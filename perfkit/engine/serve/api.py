"""What a request to `perfkit engine serve` asks for, read and checked as the OpenAI API defines it.

A prompt is a string, a list of byte ids, or a list of one of those (tokens are bytes,
perfkit.engine.data). The chat template: one user message is its content as is (its prompt tokens
are its bytes); otherwise each message is the line `<role>: <content>` and the prompt ends with
`assistant: `. Defaults: max_tokens 16 (chat too), temperature 0 (greedy; above 0, sampling seeded
by `seed`). Unknown fields are ignored; n > 1 is refused. Anything wrong is a Failure(400) naming
the field, which the server answers as an OpenAI-shaped error.
"""

from __future__ import annotations

from perfkit.engine import data

__all__ = ["Failure", "chat_prompt", "params", "prompt_tokens", "DEFAULT_MAX_TOKENS"]

DEFAULT_MAX_TOKENS = 16
_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError", 500: "InternalServerError"}


class Failure(Exception):
    """A request that fails with an HTTP status and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        error = {"message": self.message, "type": _TYPES.get(self.status, "Error"), "param": self.param}
        return {"error": {**error, "code": self.status}}


def prompt_tokens(prompt, param: str = "prompt") -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        tokens = data.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(not 0 <= t < data.VOCAB_SIZE for t in prompt):
            raise Failure(400, f"{param}: token ids must be in [0, {data.VOCAB_SIZE})", param)
        tokens = list(prompt)
    elif prompt is None:
        raise Failure(400, f"'{param}' is required", param)
    else:
        raise Failure(400, f"{param} must be a string, a list of token ids, or a list of one of those", param)
    if not tokens:
        raise Failure(400, f"{param} is empty", param)
    return tokens


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise Failure(400, "a message's content must be a string or a list of text parts", "messages")


def chat_prompt(messages) -> str:
    """The prompt of a conversation (the template is in this module's docstring)."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise Failure(400, "'messages' must be a non-empty list of messages", "messages")
    if len(messages) == 1 and messages[0].get("role") == "user":
        return _content(messages[0].get("content"))
    return "".join(f"{m.get('role', 'user')}: {_content(m.get('content'))}\n" for m in messages) + "assistant: "


def _number(body: dict, name: str, default, kind):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise Failure(400, f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    return value


def params(body: dict, chat: bool) -> dict:
    """What a completion request asks for, checked; Failure(400) when it asks something wrong."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, DEFAULT_MAX_TOKENS, int)
    if max_tokens < 1:
        raise Failure(400, f"{name} must be at least 1, got {max_tokens}", name)
    if _number(body, "n", 1, int) != 1:
        raise Failure(400, "n must be 1: this server returns one choice per request", "n")
    temperature = float(_number(body, "temperature", 0.0, int | float))
    if not 0 <= temperature < float("inf"):
        raise Failure(400, f"temperature must be >= 0, got {temperature}", "temperature")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise Failure(400, "stream_options must be an object", "stream_options")
    tokens = data.encode(chat_prompt(body.get("messages"))) if chat else prompt_tokens(body.get("prompt"))
    p = dict(tokens=tokens, max_tokens=max_tokens, temperature=temperature, seed=_number(body, "seed", 0, int))
    include_usage = bool(options.get("include_usage"))
    p.update(stream=bool(body.get("stream")), include_usage=include_usage)
    return dict(p, continuous=include_usage and bool(options.get("continuous_usage_stats")))  # as vLLM: both
