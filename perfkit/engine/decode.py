"""The decode loop: prefill, then speculative or autoregressive steps, every phase in a span.

A speculative step, for a batch whose committed cache lengths are L_b and whose root tokens (the
last emitted token of each request, not yet in the cache) are known:

    draft               drafter(root, window of the last W committed tokens and the target's
                        hidden states there) -> top-R log-probs at K positions
    tree_build          best-first tree of `budget` nodes (heapq reference or vectorized) and
                        its ancestor (visibility) block
    prepare_for_verify  verify mask (naive or compact), query tokens, positions, slots
    verify_forward      target forward over root + nodes; node K/V land in slots L_b + j
    accept              walk the tree along the target's choices (argmax, or seeded samples:
                        perfkit.engine.sampling); bonus token; one host copy
    kv_commit           move the accepted K/V to slots L_b + 1 .. L_b + accepted; bump L_b;
                        slide the drafter's window over the committed entries

An autoregressive step is the same target forward with one token (verify_forward), the host copy
(accept) and the length bump (kv_commit). Both run inside `span("step")`, so
`perfkit.probe.spans.capture().steps()` gives the breakdown with the unattributed remainder. Nothing
here synchronises the device except the one host copy per step that emitting tokens needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from perfkit.engine import data
from perfkit.engine.drafter import BlockDrafter
from perfkit.engine.model import KVCache, Transformer
from perfkit.engine.sampling import choose
from perfkit.engineoptions import FILLS, check_choices
from perfkit.errors import UserError
from perfkit.kernels import tree_build, verify_mask
from perfkit.phases import STEP
from perfkit.probe.spans import span

__all__ = ["Engine", "GenerateResult", "PREFILL_CHUNK", "APPROX_HEAD", "APPROX_TAIL", "growth"]

PREFILL_CHUNK = 512  # prefill tokens per forward: memory O(chunk * context), not O(context^2)
APPROX_HEAD = 256  # approximate fill: tokens prefilled for real at the start, then tiled
APPROX_TAIL = 64  # approximate fill: last tokens prefilled for real over the filled cache


def growth(mode: str, max_new_tokens: int, budget: int, block: int) -> int:
    """Positions a request may need past its prefix (a prompt fits when its length + this + 1 is at
    most max_seq_len). The batch steps until its slowest request has max_new_tokens; meanwhile a
    fast one commits up to block + 1 tokens a step (at most max_new_tokens steps), and a step writes
    its whole tree after what is committed."""
    return (block + 1) * max_new_tokens + block + 1 + budget + 1 if mode == "spec" else max_new_tokens + 1


@dataclass
class GenerateResult:
    """What one `Engine.generate` call produced and how long it took.

    tokens: generated ids per request (exactly max_new_tokens each); accept_lengths: per decode
    step, tokens emitted per request (accepted nodes + bonus) averaged over the batch; the first
    token comes from the prefill, so decode steps emit the rest. Times in seconds; ttft_s is
    prefill plus the first token on the host. prompt_tokens and generated_tokens are batch totals.
    fill says how the cache was filled ("approx": see Engine.generate). experts_touched: per step,
    distinct experts the step's target forward routed to, summed over layers (MoE only).
    """

    tokens: list[list[int]]
    accept_lengths: list[float]
    steps: int
    prefill_s: float
    decode_s: float
    ttft_s: float
    prompt_tokens: int
    generated_tokens: int
    fill: str
    experts_touched: list[int] = field(default_factory=list)
    mode: str = "spec"
    batch: int = 1
    budget: int = 0
    tree: str = ""
    mask: str = ""
    context: int | None = None
    temperature: float = 0.0
    seed: int = 0

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else float("nan")

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted by decode steps (all but the first token of each request)."""
        return self.generated_tokens - self.batch

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")


class Engine:
    """A target model, its block drafter, and the decode loop that drives them."""

    def __init__(self, target: Transformer, drafter: BlockDrafter, *, device, dtype: torch.dtype, preset: str = ""):
        if (
            drafter.config.vocab_size != target.config.vocab_size
            or drafter.config.target_d_model != target.config.d_model
        ):
            raise UserError("drafter and target disagree on vocabulary or hidden size")
        self.target = target.eval()
        self.drafter = drafter.eval()
        self.device = torch.device(device)
        self.dtype = dtype
        self.preset = preset

    @property
    def target_config(self):
        return self.target.config

    @property
    def drafter_config(self):
        return self.drafter.config

    # --- the public entry point ------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        mode: str = "spec",
        budget: int = 32,
        tree: str = "vectorized",
        mask: str = "compact",
        context: int | None = None,
        fill: str = "prefill",
        temperature: float = 0.0,
        seed: int = 0,
        on_step=None,
    ) -> GenerateResult:
        """Generation of `max_new_tokens` per prompt: greedy at `temperature` 0, else sampled
        with noise keyed on (`seed`, request, position), so spec and AR give the same tokens.

        mode "spec" (draft tree of `budget` nodes, built by `tree`, verified under a `mask`
        mask) or "ar" (one token per step). `context`: make every request's cached prefix
        exactly that many tokens (held-out text before the prompt, or the prompt's last tokens).
        `fill`: "prefill" runs the target over the whole prefix; "approx" prefills the first
        APPROX_HEAD and last APPROX_TAIL tokens and fills the slots between with copies of the
        first ones: the cache has the right size (attention costs are real) but not the right
        contents, for timing long contexts on a CPU in seconds. Needs equal prefix lengths.
        `on_step`: called with the tokens each request gained (list[list[int]], never past
        max_new_tokens) after the first token and after every decode step, for streaming.
        """
        prefixes = self._prefixes(prompts, context)
        self._check(prefixes, max_new_tokens, mode, budget, tree, mask, fill)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature < float("inf"):
            raise UserError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if not isinstance(seed, int):
            raise UserError(f"seed must be an int, got {seed!r}")
        b = len(prefixes)
        lens = [len(p) for p in prefixes]
        capacity = max(lens) + self._growth(mode, max_new_tokens, budget) + 1
        cache = KVCache(self.target.config, batch=b, capacity=capacity, device=self.device, dtype=self.dtype)

        t0 = time.perf_counter()
        fill_cache = self._approx_fill if fill == "approx" else self._prefill
        st = _State(
            cache=cache,
            lens=list(lens),
            lens_t=torch.tensor(lens, device=self.device),
            out=[[] for _ in prefixes],
            temperature=float(temperature),
            seed=seed,
        )
        st.win_hidden = fill_cache(prefixes, cache)  # [B, W, D], hidden states of the last W positions
        st.win_tokens = self._window_tokens(prefixes)
        st.root = st.choose(self.target.head(st.win_hidden[:, -1]), st.lens_t)  # [B] first generated token
        for o, t in zip(st.out, st.root.tolist()):
            o.append(t)
        t1 = time.perf_counter()

        self._decode(st, mode, max_new_tokens, dict(budget=budget, tree=tree, mask=mask), on_step)
        t2 = time.perf_counter()
        tokens = [o[:max_new_tokens] for o in st.out]
        return GenerateResult(
            tokens=tokens,
            accept_lengths=st.accept_lengths,
            steps=len(st.accept_lengths),
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
            ttft_s=t1 - t0,
            prompt_tokens=sum(lens),
            generated_tokens=sum(len(t) for t in tokens),
            fill=fill,
            experts_touched=st.touched,
            mode=mode,
            batch=b,
            budget=budget if mode == "spec" else 0,
            tree=tree if mode == "spec" else "",
            mask=mask if mode == "spec" else "",
            context=context,
            temperature=float(temperature),
            seed=seed,
        )

    def _decode(self, st: _State, mode: str, max_new_tokens: int, options: dict, on_step):
        """Decode steps until every request has max_new_tokens, handing each step's new tokens
        (and first the prefill's) to `on_step` when given."""
        step = self._spec_step if mode == "spec" else self._ar_step
        sent = [0] * len(st.out)  # tokens handed to on_step so far, per request
        while True:
            if on_step is not None:
                on_step([o[n:max_new_tokens] for o, n in zip(st.out, sent)])
                sent = [min(len(o), max_new_tokens) for o in st.out]
            if min(len(o) for o in st.out) >= max_new_tokens:
                return
            step(st, **options)

    # --- argument handling ---------------------------------------------------------------------

    def _prefixes(self, prompts, context):
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, list) and p for p in prompts):
            raise UserError("prompts must be a non-empty list of non-empty token lists")
        vocab = self.target.config.vocab_size
        for p in prompts:
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in p):
                raise UserError(f"prompt tokens must be ints in [0, {vocab})")
        if context is None:
            return [list(p) for p in prompts]
        if not isinstance(context, int) or context < 1:
            raise UserError(f"context must be a positive int, got {context!r}")
        filler = data.heldout_text()
        out = []
        for p in prompts:
            need = context - len(p)
            if need <= 0:
                out.append(list(p[-context:]))
                continue
            reps = need // len(filler) + 1
            out.append(list((filler * reps)[-need:]) + list(p))
        return out

    def _check(self, prefixes, max_new_tokens, mode, budget, tree, mask, fill):
        check_choices(mode=mode, tree=tree, mask=mask)
        if fill not in FILLS:
            raise UserError(f"fill must be one of {FILLS}, got {fill!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not isinstance(budget, int) or budget < 1:
            raise UserError(f"budget must be a positive int, got {budget!r}")
        if fill == "approx" and len({len(p) for p in prefixes}) != 1:
            raise UserError("fill='approx' needs prefixes of equal length (pass context=N)")
        longest = max(len(p) for p in prefixes) + self._growth(mode, max_new_tokens, budget) + 1
        if longest > self.target.config.max_seq_len:
            raise UserError(
                f"prompt + generation ({longest} positions) exceeds max_seq_len {self.target.config.max_seq_len}"
            )

    def _growth(self, mode: str, max_new_tokens: int, budget: int) -> int:
        return growth(mode, max_new_tokens, budget, self.drafter.config.block)

    # --- filling the cache -----------------------------------------------------------------------

    def _forward_range(self, tokens, cache, start: int):
        """Target over tokens [B, Q] at positions start.. for every request (uniform slots)."""
        b, q = tokens.shape
        positions = (start + torch.arange(q, device=self.device)).expand(b, q)
        lens = torch.full((b,), start, device=self.device)
        return self.target.forward(
            tokens,
            cache,
            positions=positions,
            slots=positions,
            mask=verify_mask.causal_mask(lens, q),
            kv_len=start + q,
            uniform_start=start,
        )

    def _wanted(self, lengths: list[int]) -> torch.Tensor:
        """Positions [B, W] of each request's last W prefix tokens (negative: before the start)."""
        w = self.drafter.config.window
        ends = torch.tensor(lengths, device=self.device)
        return ends[:, None] - w + torch.arange(w, device=self.device)

    @staticmethod
    def _collect(h, start: int, wanted, window):
        """Copy the hidden states of positions `wanted` that the forward over [start, start + Q)
        produced (h: [B, Q, D]) into `window` [B, W, D]."""
        q = h.shape[1]
        inside = (wanted >= start) & (wanted < start + q)  # [B, W]
        got = h.gather(1, (wanted - start).clamp(0, q - 1)[:, :, None].expand(-1, -1, h.shape[2]))
        return torch.where(inside[:, :, None], got, window)

    def _window_tokens(self, prefixes) -> torch.Tensor:
        w = self.drafter.config.window
        rows = [([0] * w + p[-w:])[-w:] for p in prefixes]
        return torch.tensor(rows, device=self.device)

    def _empty_window(self, b: int):
        return torch.zeros(
            b, self.drafter.config.window, self.target.config.d_model, device=self.device, dtype=self.dtype
        )

    def _prefill(self, prefixes, cache):
        """Chunked prefill of right-padded prefixes; hidden states of each one's last W positions."""
        b = len(prefixes)
        longest = max(len(p) for p in prefixes)
        padded = torch.zeros(b, longest, dtype=torch.int64)
        for i, p in enumerate(prefixes):
            padded[i, : len(p)] = torch.tensor(p)
        padded = padded.to(self.device)
        wanted = self._wanted([len(p) for p in prefixes])
        window = self._empty_window(b)
        for start in range(0, longest, PREFILL_CHUNK):
            h = self._forward_range(padded[:, start : start + PREFILL_CHUNK], cache, start)  # [B, Q, D]
            window = self._collect(h, start, wanted, window)
        return window

    def _approx_fill(self, prefixes, cache):
        """Real prefill of the head and the tail, copies of the head in between (see generate)."""
        n = len(prefixes[0])
        head = min(n, APPROX_HEAD)
        tail = min(n - head, APPROX_TAIL)
        tokens = torch.tensor(prefixes, device=self.device)
        wanted = self._wanted([n] * len(prefixes))
        window = self._empty_window(len(prefixes))
        for start in range(0, head, PREFILL_CHUNK):
            h = self._forward_range(tokens[:, start : min(head, start + PREFILL_CHUNK)], cache, start)
            window = self._collect(h, start, wanted, window)
        filled = head
        while filled < n - tail:  # double the filled range by copying it after itself
            width = min(filled, n - tail - filled)
            cache.kv[:, :, :, :, filled : filled + width] = cache.kv[:, :, :, :, :width]
            filled += width
        if tail:
            h = self._forward_range(tokens[:, n - tail :], cache, n - tail)
            window = self._collect(h, n - tail, wanted, window)
        return window

    # --- one decode step -------------------------------------------------------------------------

    def _spec_step(self, st: _State, *, budget: int, tree: str, mask: str):
        b = len(st.lens)
        dev = self.device
        k = self.drafter.config.block
        w = self.drafter.config.window
        vocab = self.target.config.vocab_size
        with span(STEP):
            with span("draft"):
                logits = self.drafter(st.root, st.win_tokens, st.win_hidden)  # [B, K, V]
                top_lp, top_tok = logits.float().log_softmax(-1).topk(min(budget, vocab), dim=-1)  # [B, K, R]
            with span("tree_build"):
                t = tree_build.BUILDERS[tree](top_lp, budget)
                nodes = tree_build.node_tokens(t, top_tok)  # [B, N]
                visible = verify_mask.ancestors(t.parents, k)  # [B, Q, Q]: entry i sees its ancestors j
            with span("prepare_for_verify"):
                vm = verify_mask.BUILDERS[mask](st.lens_t, visible, k)
                q = budget + 1
                query_tokens = torch.cat([st.root[:, None], nodes], 1)  # [B, Q]: root, then nodes
                depth = torch.cat([torch.zeros(b, 1, dtype=torch.int64, device=dev), t.depths], 1)  # [B, Q]
                positions = st.lens_t[:, None] + depth
                slots = st.lens_t[:, None] + torch.arange(q, device=dev)
            with span("verify_forward"):
                uniform = st.lens[0] if len(set(st.lens)) == 1 else None
                h = self.target.forward(
                    query_tokens,
                    st.cache,
                    positions=positions,
                    slots=slots,
                    mask=vm,
                    kv_len=max(st.lens) + q,
                    uniform_start=uniform,
                )  # [B, Q, D]
                pred = st.choose(self.target.head(h), positions + 1)  # [B, Q] target's next token after each entry
                moe = self.target.experts_touched()
            with span("accept"):
                # A node matches when its token is the target's prediction at its parent; it is
                # accepted when it and all its ancestors match (the root always does).
                match = torch.cat(
                    [torch.ones(b, 1, dtype=torch.bool, device=dev), nodes == pred.gather(1, t.parents + 1)], 1
                )
                accepted = ~(vm.block & ~match[:, None, :]).any(-1)  # [B, Q]
                n_acc, last = torch.where(accepted, depth, -1).max(1)  # [B]: nodes accepted, deepest entry
                bonus = pred.gather(1, last[:, None])[:, 0]
                # path[d] = query index of the accepted entry at depth d (0: root); spare entries
                # point at the root and land beyond the committed length, where nothing reads.
                path = torch.zeros(b, k + 2, dtype=torch.int64, device=dev)
                path.scatter_(1, torch.where(accepted, depth, k + 1), torch.arange(q, device=dev).expand(b, q))
                path = path[:, : k + 1]
                path_tokens = query_tokens.gather(1, path)  # [B, K + 1]
                emitted = torch.cat([n_acc[:, None], bonus[:, None], path_tokens], 1)
                if moe is not None:
                    emitted = torch.cat([emitted, moe.expand(b)[:, None]], 1)
                rows = emitted.tolist()  # the step's one device-to-host copy
                for i, row in enumerate(rows):
                    n = row[0]
                    st.out[i].extend(row[3 : 3 + n] + [row[1]])
                    st.lens[i] += 1 + n
                st.accept_lengths.append(sum(1 + row[0] for row in rows) / b)
                if moe is not None:
                    st.touched.append(rows[0][-1])
            with span("kv_commit"):
                base = st.lens_t[:, None]
                st.cache.move(base + path, base + torch.arange(k + 1, device=dev))
                # The drafter's window slides by the 1 + n_acc entries just committed.
                keep = (n_acc + 1)[:, None] + torch.arange(w, device=dev)  # [B, W]
                st.win_tokens = torch.cat([st.win_tokens, path_tokens], 1).gather(1, keep)
                path_h = h.gather(1, path[:, :, None].expand(-1, -1, h.shape[2]))  # [B, K + 1, D]
                st.win_hidden = torch.cat([st.win_hidden, path_h], 1).gather(
                    1, keep[:, :, None].expand(-1, -1, h.shape[2])
                )
                st.lens_t += 1 + n_acc
                st.root = bonus

    def _ar_step(self, st: _State, *, budget: int, tree: str, mask: str):
        b = len(st.lens)
        with span(STEP):
            with span("verify_forward"):
                uniform = st.lens[0] if len(set(st.lens)) == 1 else None
                pos = st.lens_t[:, None]
                h = self.target.forward(
                    st.root[:, None],
                    st.cache,
                    positions=pos,
                    slots=pos,
                    mask=verify_mask.causal_mask(st.lens_t, 1),
                    kv_len=max(st.lens) + 1,
                    uniform_start=uniform,
                )
                nxt = st.choose(self.target.head(h[:, 0]), st.lens_t + 1)  # [B]
                moe = self.target.experts_touched()
            with span("accept"):
                emitted = nxt[:, None] if moe is None else torch.cat([nxt[:, None], moe.expand(b)[:, None]], 1)
                rows = emitted.tolist()
                for i, row in enumerate(rows):
                    st.out[i].append(row[0])
                    st.lens[i] += 1
                st.accept_lengths.append(1.0)
                if moe is not None:
                    st.touched.append(rows[0][-1])
            with span("kv_commit"):
                st.lens_t += 1
                st.root = nxt


@dataclass
class _State:
    """What a decode step reads and advances."""

    cache: KVCache
    lens: list[int]  # committed cache length per request (host copy)
    lens_t: torch.Tensor  # the same on the device, [B]
    out: list[list[int]]  # tokens emitted per request
    root: torch.Tensor | None = None  # [B] last emitted token, not yet in the cache
    win_tokens: torch.Tensor | None = None  # [B, W] last committed tokens (drafter window)
    win_hidden: torch.Tensor | None = None  # [B, W, D] target hidden states at those positions
    accept_lengths: list[float] = field(default_factory=list)
    touched: list[int] = field(default_factory=list)
    temperature: float = 0.0
    seed: int = 0

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's token for each position (`perfkit.engine.sampling.choose`)."""
        return choose(logits, positions, temperature=self.temperature, seed=self.seed)
