"""What a `perfkit gpu-check` report says: its findings in sentences, its markdown, and the sections
that failed. Pure functions of the report dict that `perfkit.machine.gpucheck.run` builds (each
section its `value`, or its `error` and traceback); nothing here touches a device or a file.
"""

from __future__ import annotations

import json

__all__ = ["findings", "render_markdown", "failed_sections"]


def findings(report: dict) -> list[str]:
    """What the measurements say, in sentences (pure: computed from the report dict)."""
    out = []
    for k in report.get("kernels", {}).get("value", []) or []:
        ev, nosync, sync = k["events_ms"], k["wall_nosync_ms"], k["wall_sync_ms"]
        if nosync < 0.5 * ev:
            out.append(
                f"{k['kernel']}: host clock without sync says {nosync:.4g} ms, {ev / nosync:.1f}x below the "
                f"kernel's {ev:.4g} ms (it times the launch, not the work)"
            )
        if sync > 1.5 * ev:
            out.append(
                f"{k['kernel']}: a sync per call says {sync:.4g} ms, {sync / ev:.1f}x the kernel's {ev:.4g} ms "
                f"(launch + sync latency dominates)"
            )
    sp = report.get("spans", {}).get("value")
    if sp:
        verdict = "agree with" if 0.8 <= sp["span_vs_events"] <= 1.25 else "DISAGREE with"
        out.append(
            f"perfkit spans {verdict} CUDA events: {sp['span_mean_ms']:.4g} ms vs {sp['events_ms']:.4g} ms "
            f"(host clock without sync: {sp['wall_nosync_ms']:.4g} ms)"
        )
    bw = report.get("bandwidth", {}).get("value")
    if bw and bw.get("peak_bytes_per_s"):
        out.append(
            f"measured device triad {bw['triad_bytes_per_s'] / 1e12:.3g} TB/s = "
            f"{100 * bw['triad_bytes_per_s'] / bw['peak_bytes_per_s']:.0f}% of the NVML-derived peak "
            f"{bw['peak_bytes_per_s'] / 1e12:.3g} TB/s"
        )
    nv = report.get("nvtx", {}).get("value")
    if nv:
        out.append(nv["note"])
    for r in report.get("tree_build", {}).get("value", []) or []:
        if (r["batch"], r["budget"]) in ((1, 64), (128, 64)):
            same = "identical trees" if r["same_trees"] else "DIFFERENT TREES"
            out.append(
                f"tree build, batch {r['batch']}, budget {r['budget']}: vectorized {r['vectorized_ms']:.4g} ms vs "
                f"heapq {r['heap_ms']:.4g} ms with its copy to the host: {r['speedup']:.3g}x "
                f"[{r['speedup_low']:.3g}, {r['speedup_high']:.3g}], {same}"
            )
    for e in report.get("engine", {}).get("value", []) or []:
        out.append(
            f"engine {e['mode']} at {e['context']} context: {e['decode_tok_s']:.4g} tok/s; spans' steps sum to "
            f"{e['spans_step_total_s']:.4g} s of {e['wall_s_synchronised']:.4g} s synchronised wall; verify_forward "
            f"{e['verify_forward_ms']:.4g} ms = {e['verify_forward_ms'] / e['verify_floor_ms']:.3g}x its floor "
            f"({e['verify_floor_note']})"
        )
    failed = [name for name, sec in report.items() if isinstance(sec, dict) and "error" in sec]
    if failed:
        out.append(f"FAILED sections: {', '.join(failed)} (see their errors below)")
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_markdown(report: dict) -> str:
    """The report as short markdown: findings first, then each section's figures."""
    lines = [f"# perfkit gpu-check ({report['meta']['started_at']})", ""]
    gpus = report.get("environment", {}).get("value", {}).get("gpus", [])
    for g in gpus:
        lines.append(
            f"- GPU {g['index']}: {g['name']}, driver {report['environment']['value'].get('nvidia_driver')}, "
            f"{_fmt((g.get('memory_total_bytes') or 0) / 2**30)} GiB, peak DRAM "
            f"{_fmt((g.get('peak_dram_bytes_per_s') or 0) / 1e12)} TB/s"
        )
    lines += ["", "## Findings", ""] + [f"- {f}" for f in findings(report)] + [""]
    kern = report.get("kernels", {}).get("value")
    if kern:
        lines += [
            "## Kernel timing three ways (ms per call)",
            "",
            "| kernel | CUDA events | wall, no sync | wall, sync each call | TFLOP/s | GB/s |",
            "|---|---|---|---|---|---|",
        ]
        for k in kern:
            lines.append(
                f"| {k['kernel']} | {_fmt(k['events_ms'])} | {_fmt(k['wall_nosync_ms'])} | "
                f"{_fmt(k['wall_sync_ms'])} | {_fmt(k['tflops'])} | {_fmt(k['gbps'])} |"
            )
        lines.append("")
    for name in ("bandwidth", "spans", "nvtx", "profiler", "tree_build", "engine"):
        sec = report.get(name)
        if sec is None:
            continue
        lines.append(f"## {name}")
        lines.append("")
        if "error" in sec:
            lines += ["FAILED: " + sec["error"], "", "```", sec.get("traceback", "").rstrip(), "```", ""]
            continue
        lines += ["```json", json.dumps(sec["value"], indent=1, default=str)[:4000], "```", ""]
    lines.append(f"Took {report['meta']['seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def failed_sections(report: dict) -> list[str]:
    """The sections that make the check fail: those that raised, NVTX or the profiler not seeing what
    they should, and a vectorized tree build that built other trees than the heapq."""
    bad = [n for n, s in report.items() if isinstance(s, dict) and "error" in s]
    for name in ("nvtx", "profiler"):
        if report.get(name, {}).get("value", {}).get("ok") is False:
            bad.append(name)
    if any(not r["same_trees"] for r in report.get("tree_build", {}).get("value", None) or []):
        bad.append("tree_build")
    return bad
