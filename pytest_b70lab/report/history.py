"""`b70lab history --html PAGE`: each series of decode figures as a plot with its intervals and change points, in
the style of `b70lab report` (plotly.js inlined once: the page fetches nothing). It draws what
records.history built; it decides nothing."""

from __future__ import annotations

from pathlib import Path

from ..records.history import Series, short
from . import CSS, Raw, ReportError, _p, _Plots, _section, _table


def _series_section(n: int, s: Series, plots: _Plots) -> Raw:
    import plotly.graph_objects as go

    xs = [f"{i + 1}: {short(p.commit)}" for i, p in enumerate(s.points)]
    fig = go.Figure(
        go.Scatter(
            x=xs,
            y=[p.figure for p in s.points],
            mode="lines+markers",
            name="decode tok/s (median over prompts)",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [p.high - p.figure for p in s.points],
                "arrayminus": [p.figure - p.low for p in s.points],
            },
            text=[f"{p.folder}<br>{p.when[:19]}<br>vLLM {p.vllm}, torch {p.torch}" for p in s.points],
            hovertemplate="%{y:.2f} tok/s<br>%{text}<extra></extra>",
        )
    )
    for c in s.changes:
        fig.add_vline(x=c.index - 0.5, line_dash="dash", line_color="#d62728")
    fig.update_layout(
        xaxis={"title": "run (in launch order): lab commit", "type": "category"},
        yaxis={"title": "decode rate (tok/s)", "rangemode": "tozero"},
    )
    rows = [
        [
            str(i + 1),
            p.when[:19],
            short(p.commit),
            p.digest[:12],
            f"{p.vllm} / {p.torch}",
            f"{p.figure:.2f} [{p.low:.2f}, {p.high:.2f}]",
            p.kind,
            p.where,
        ]
        for i, p in enumerate(s.points)
    ]
    notes = [_p(s.change_line(c), "note") for c in s.changes] or [_p("No change point in this series.", "note")]
    return _section(
        f"series-{n}",
        f"{s.contract} on {s.host_class}",
        plots.div(f"series-{n}", fig),
        *notes,
        _table(["#", "launched", "commit", "contract digest", "vLLM / torch", "tok/s [90 %]", "kind", "folder"], rows),
    )


def render(series: list[Series], skipped: list[str]) -> str:
    plots = _Plots()
    body = "".join(_series_section(n, s, plots) for n, s in enumerate(series, 1))
    if skipped:
        body += _section("skipped", "Folders without a point", *(_p(line) for line in skipped))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>b70lab history</title><style>{CSS}</style></head><body>"
        "<h1>b70lab history: decode figures over runs</h1>"
        + _p(
            "One series per contract and host class (speeds are compared within a class only); dashed lines mark "
            "change points (ruptures, PELT)."
        )
        + f"{body}</body></html>\n"
    )


def write(series: list[Series], skipped: list[str], out: Path) -> Path:
    try:
        out.write_text(render(series, skipped), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the history page to {out}: {e.strerror or e}") from e
    return out
