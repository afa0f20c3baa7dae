"""`DIR/sweep.html`: a sweep's table as one self-contained page in the style of `b70lab report` (plotly.js
inlined once: the page fetches nothing). It renders sweep.json alone, so the page and the file cannot
disagree; like the report, it shows and decides nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import CSS, Raw, ReportError, _h, _num, _p, _Plots, _section, _table

FILENAME = "sweep.html"
VERDICT_CLASS = {"pass": "pass", "fail": "fail", "incomplete": "incomplete", "none": "none"}


def _ratio(p: dict[str, Any] | None) -> str:
    return "n/a" if not p else f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]"


def _table_section(sweep: dict[str, Any]) -> Raw:
    rows = []
    for i, r in enumerate(sweep["variants"]):
        starts = r.get("starts") or []
        rows.append(
            [
                Raw(f'<b id="variant-{_h(r["variant"])}">{_h(r["variant"])}</b>'),
                Raw(
                    f'<span class="verdict-text {VERDICT_CLASS.get(r["verdict"], "none")}">{_h(r["verdict"].upper())}</span>'
                ),
                f"{sum(s['status'] == 'ok' for s in starts)}/{r['starts_required']}",
                _num(r.get("decode_median")),
                "base" if i == 0 else _ratio(r.get("paired_to_base")),
                "" if i == 0 else _num(r.get("medians_to_base"), ".3f"),
                r.get("outputs_identical_to_base") or "",
                _num(r.get("accepted_per_draft")),
                "n/a" if r.get("kv_blocks") is None else f"{r['kv_blocks']} ({r.get('kv_tokens')} tokens)",
                r.get("kv_cache_dtype") or "",
                ", ".join(f"{s['ready_s']:.0f}" for s in starts if s.get("ready_s")),
                ", ".join(s["graphs"] for s in starts),
                r["judged_against"],
                ", ".join(f"{k} = {v}" for k, v in (r.get("changes") or {}).items()) or "the base contract",
            ]
        )
    head = [
        "variant",
        "verdict",
        "starts ok",
        "decode tok/s (median)",
        "paired vs base [95 %]",
        "medians vs base",
        "outputs = base",
        "accepted / draft",
        "KV blocks (tokens)",
        "KV dtype",
        "ready (s)",
        "graphs",
        "judged against",
        "changes",
    ]
    lines = [
        Raw(
            f'<li><b>{_h(r["variant"])}</b>: <span class="verdict-text '
            f'{VERDICT_CLASS.get(r["verdict"], "none")}">{_h(r["verdict_line"])}</span></li>'
        )
        for r in sweep["variants"]
    ]
    notes = [f"{r['variant']}: {n}" for r in sweep["variants"] for n in r.get("notes") or []]
    return _section(
        "variants",
        "Variants",
        _table(head, rows, "numbers"),
        _p(
            "Decode rate: the median over the variant's completed starts of each start's endpoint median "
            "((N - 1) / (t_N - t_1) per request, from the arrival times). Paired: the geometric mean over "
            "prompts of the variant / base per-prompt ratio (each prompt's rate the median over its "
            "starts), 95 % bootstrap interval over prompts; the figure gate 7 judges. KV capacity: "
            "vLLM's cache_config_info (num_gpu_blocks, kv_cache_size_tokens), as the engine allocated it.",
            "note",
        ),
        Raw("<h3>Verdicts</h3><ul>" + "".join(lines) + "</ul>"),
        *(_p(n, "note") for n in notes),
    )


def _starts_section(sweep: dict[str, Any]) -> Raw:
    """Every start in the order the sweep ran them: the interleaving, and what each start did."""
    facts = {(r["variant"], s["index"]): s for r in sweep["variants"] for s in r.get("starts") or []}
    rows = []
    for n, label in enumerate(sweep.get("order") or [], 1):
        variant, _, rest = label.rpartition(" start-")
        s = facts.get((variant, int(rest))) if rest.isdigit() and not variant.endswith(" teacher") else None
        status = (sweep.get("status") or {}).get(label, "")
        rows.append(
            [
                n,
                label,
                status,
                s.get("launched_at", "") if s else "",
                _num(s.get("ready_s"), ".1f") if s else "",
                _num(s.get("decode_median")) if s else "",
                s.get("graphs", "") if s else "",
                (s.get("box") or "not recorded") if s else "",
            ]
        )
    return _section(
        "starts",
        "Starts, in the order they ran",
        _table(
            ["#", "start", "status", "launched (UTC)", "ready (s)", "decode tok/s (median)", "graphs", "box"],
            rows,
            "numbers",
        ),
        _p(
            "Graphs: compiled (the start traced and compiled them) or loaded (vLLM's AOT compile cache). "
            "A variant's own teacher runs once, at the end of round 1.",
            "note",
        ),
    )


def _speed_plots(sweep: dict[str, Any], plots: _Plots) -> Raw:
    import plotly.graph_objects as go

    variants = [r for r in sweep["variants"] if r.get("decode_median") is not None]
    if not variants:
        return _section("speed", "Decode rate", _p("No variant completed a start: no decode rate to show."))
    base = sweep["variants"][0]
    fig = go.Figure(
        go.Bar(
            x=[r["variant"] for r in variants],
            y=[r["decode_median"] for r in variants],
            marker={"color": [{"pass": "#2ca02c", "fail": "#d62728"}.get(r["verdict"], "#e0a800") for r in variants]},
            text=[f"{r['decode_median']:.1f}" for r in variants],
            textposition="outside",
        )
    )
    fig.update_layout(xaxis={"title": "variant"}, yaxis={"title": "decode rate (tok/s, median)", "rangemode": "tozero"})
    parts: list[Any] = [
        plots.div("speed", fig),
        _p(
            "Bar colour: the variant's verdict (green promotable, red failed, amber incomplete or not "
            "judged); the speed is shown whether or not it passed.",
            "note",
        ),
    ]
    for field in sweep.get("fields") or []:
        points = [(x, r) for r in variants if (x := _field_value(r, field, base)) is not None]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
        points.sort(key=lambda p: p[0] if numeric else str(p[0]))
        if len(points) < 2:
            continue
        fig = go.Figure(
            go.Scatter(
                x=[str(x) for x, _ in points],
                y=[r["decode_median"] for _, r in points],
                mode="lines+markers",
                marker={"size": 11},
                text=[r["variant"] for _, r in points],
            )
        )
        fig.update_layout(
            xaxis={"title": field, "type": "category"},
            yaxis={"title": "decode rate (tok/s, median)", "rangemode": "tozero"},
        )
        parts.append(plots.div(f"speed-vs-{field}", fig))
    return _section("speed", "Decode rate", *parts)


def _field_value(row: dict[str, Any], field: str, base: dict[str, Any]) -> Any:
    """The variant's value of a varied field: its change, the base's own value for the base, None for a
    named variant (target-only, unquantized-kv), which is not a point of the grid."""
    if field in (row.get("changes") or {}):
        return row["changes"][field]
    if row is base:
        return base.get("base_values", {}).get(field)
    return None


def _acceptance_plot(sweep: dict[str, Any], plots: _Plots) -> Raw:
    import plotly.graph_objects as go

    curves = [r for r in sweep["variants"] if r.get("acceptance_per_position")]
    if not curves:
        return _section(
            "acceptance",
            "Acceptance per draft position",
            _p("No variant speculated (or none recorded its acceptance counters)."),
        )
    fig = go.Figure()
    for r in curves:
        pos = sorted(r["acceptance_per_position"], key=int)
        fig.add_trace(
            go.Scatter(
                x=[int(p) for p in pos],
                y=[r["acceptance_per_position"][p] for p in pos],
                mode="lines+markers",
                name=r["variant"],
            )
        )
    fig.update_layout(
        xaxis={"title": "draft position (0: the first drafted token)", "dtick": 1},
        yaxis={"title": "accepted / drafts", "range": [0, 1.05]},
    )
    rows = [[r["variant"], _num(r.get("accepted_per_draft")), len(r["acceptance_per_position"])] for r in curves]
    return _section(
        "acceptance",
        "Acceptance per draft position",
        plots.div("acceptance", fig),
        _p(
            "Pooled over each variant's starts: vLLM's per-position accepted counter over the drafts "
            "proposed, after the prompts minus before.",
            "note",
        ),
        _table(["variant", "accepted tokens per draft", "positions"], rows, "numbers"),
    )


def _identity(sweep: dict[str, Any]) -> Raw:
    rows = [
        ["base contract", f"{sweep['base']} ({sweep['base_digest'][:16]})"],
        ["varied", "; ".join(sweep.get("varies") or []) or "nothing (named variants only)"],
        ["named variants", ", ".join(sweep.get("named") or []) or "none"],
        ["rounds", sweep["rounds"]],
        ["prompts", sweep.get("prompts") or "all"],
        ["start order", ", ".join(sweep.get("order") or [])],
        [
            "own teachers",
            "; ".join(f"{k}: {len(v)} snapshots" for k, v in (sweep.get("teachers") or {}).items())
            or "none (every variant is judged against the base's teacher or none)",
        ],
        ["CPU", sweep.get("cpu") or "?"],
        ["written", sweep.get("created_at") or "?"],
    ]
    problems = sweep.get("problems") or []
    return _section(
        "sweep",
        "Sweep",
        _table(None, rows, "identity"),
        _p(
            "Every planned start ran and every variant was judged."
            if not problems
            else "Problems: " + "; ".join(problems),
            "verdict-text " + ("pass" if not problems else "fail"),
        ),
    )


def render(sweep: dict[str, Any]) -> str:
    plots = _Plots()
    body = "".join(
        [
            _identity(sweep),
            _table_section(sweep),
            _starts_section(sweep),
            _speed_plots(sweep, plots),
            _acceptance_plot(sweep, plots),
        ]
    )
    title = f"b70lab sweep of {sweep['base']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_h(title)}</title><style>{CSS}</style></head><body><h1>{_h(title)}</h1>{body}</body></html>\n"
    )


def write(sweep_json: Path, out: Path | None = None) -> Path:
    """Render DIR/sweep.json to `out` (default DIR/sweep.html); returns the path written."""
    try:
        sweep = json.loads(Path(sweep_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read the sweep table {sweep_json}: {e}") from e
    if not isinstance(sweep, dict) or not isinstance(sweep.get("variants"), list) or not sweep["variants"]:
        raise ReportError(f"{sweep_json} is not a sweep table (no variants)")
    out = Path(out) if out is not None else Path(sweep_json).parent / FILENAME
    try:
        out.write_text(render(sweep), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the sweep page to {out}: {e.strerror or e}") from e
    return out
