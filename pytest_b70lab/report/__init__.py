"""`b70lab report`: a run folder as one self-contained HTML page, so that a promotion can be read and argued
about away from the terminal it was decided in (plotly.js is inlined: the page fetches nothing when opened).

The page only shows; it decides nothing. The verdict is promotion.json's, and the page says PROMOTABLE only
when that file says promotable and complete for the contract the evidence was recorded under.
"""

from __future__ import annotations

import html
import re
import shlex
from collections.abc import Iterable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from ..errors import LabError
from ..evidence import host, run_folder, throughput
from ..evidence import record as evidence_mod
from ..evidence.metrics import ACCEPTED_PER_POS, DRAFTS, Acceptance, acceptance
from ..evidence.record import Evidence, EvidenceError, ModelRef, Request
from ..evidence.run_folder import Run
from ..judge import reproduction
from ..judge.catalogue import GATE_NAMES
from ..judge.compare import headline as run_headline
from ..judge.replay import recorded_contract

FILENAME = "report.html"
PROMOTION = run_folder.PROMOTION
_SUBJECT = re.compile(r"^start-(\d+)(?: rank-(\d+)| prompt:(.*))?$", re.S)


class ReportError(LabError, ValueError):
    """The run folder cannot be reported: missing, or its evidence or verdict is corrupted."""


# --- reading ----------------------------------------------------------------------------------------------


def load(folder: Path) -> Run:
    """Every start-N/evidence.json of a run folder and its promotion.json (if any); anything unreadable is a
    ReportError that names the file."""
    folder = Path(folder)
    try:
        run = run_folder.read(folder)
    except EvidenceError as e:
        raise ReportError(str(e)) from e
    if not run.starts and run.promotion is None:
        raise ReportError(
            f"{folder} holds no start-N/{evidence_mod.FILENAME} and no {PROMOTION}: not a b70lab run folder"
        )
    return run


# --- what the plots show (pure) -------------------------------------------------------------------------


def arrival(request: Request) -> tuple[list[float], list[int]]:
    """(seconds since the request began, tokens received by then), one point per streamed chunk."""
    n = min(len(request.chunk_times), len(request.chunk_tokens))
    return list(request.chunk_times[:n]), list(accumulate(request.chunk_tokens[:n]))


def decode_rate(start: Evidence, request: Request) -> float | None:
    """From the request's arrival times (the page shows no figure the evidence merely states)."""
    return throughput.arrival_rates([request])[0].get(request.prompt_id)


def speed(starts: Sequence[Evidence]) -> reproduction.SpeedFigures | None:
    """Gate 7's figures of these starts under the contract they were recorded with (its schedule decides how
    they are taken: per prompt over the passes, when interleaved); None when there is no one recorded contract."""
    judged = _judged_speed(starts)
    return judged[0] if judged is not None else None


def _judged_speed(
    starts: Sequence[Evidence],
) -> tuple[reproduction.SpeedFigures, list[reproduction.SpeedDecision]] | None:
    """Gate 7's figures and its decision on each later start's speed, as the judge takes them."""
    try:
        contract = recorded_contract(starts, Path("<run folder>"))
    except EvidenceError:
        return None
    figures = reproduction.speed_figures(list(starts), contract)
    return figures, reproduction.speed_decisions(list(starts), figures, contract)


def _median(figures: reproduction.SpeedFigures | None, starts: Sequence[Evidence], start: Evidence) -> float | None:
    at = next((i for i, s in enumerate(starts) if s is start), None)
    if figures is not None and at is not None:
        return figures.medians[at]
    return throughput.arrival_median(start.requests)


def prompt_order(starts: Sequence[Evidence]) -> list[str]:
    return list(dict.fromkeys(r.prompt_id for s in starts for r in s.requests))


# --- the verdict line -------------------------------------------------------------------------------------


def headline(run: Run) -> tuple[str, str]:
    """(css class, the line): promotion.json's verdict, else the one judged now (compare.headline, as
    `evidence show` prints it)."""
    return run_headline(run)


# --- HTML helpers -----------------------------------------------------------------------------------------


class Raw(str):
    """HTML this module built itself; every other string is escaped on its way into the page."""


def _h(value: Any) -> str:
    return value if isinstance(value, Raw) else html.escape("" if value is None else str(value))


def _table(headers: Sequence[Any] | None, rows: Iterable[Sequence[Any]], cls: str = "") -> Raw:
    head = "<thead><tr>" + "".join(f"<th>{_h(h)}</th>" for h in headers) + "</tr></thead>" if headers else ""
    body = "".join("<tr>" + "".join(f"<td>{_h(c)}</td>" for c in row) + "</tr>" for row in rows)
    return Raw(f'<table class="{cls}">{head}<tbody>{body}</tbody></table>')


def _section(anchor: str, title: str, *parts: Any) -> Raw:
    return Raw(f'<section id="{anchor}"><h2>{_h(title)}</h2>' + "".join(_h(p) for p in parts) + "</section>")


def _p(text: Any, cls: str = "") -> Raw:
    return Raw(f'<p class="{cls}">{_h(text)}</p>')


def _pre(text: Any) -> Raw:
    return Raw(f"<pre>{_h(text)}</pre>")


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _label(text: str) -> str:
    """Text for plotly, which reads trace names and categories as a little HTML: escaped, it shows them as
    written (plotly turns the entities back into characters)."""
    return html.escape(text)


# --- sections ---------------------------------------------------------------------------------------------


def _model(ref: ModelRef | None) -> Raw:
    if ref is None:
        return Raw("none (the contract does not speculate)")
    lines = [
        ref.ref + (f" @ {ref.revision}" if ref.revision else ""),
        f"checkpoint digest {ref.digest or 'n/a'}",
        f"manifest digest {ref.manifest_digest or 'n/a'}",
    ]
    return Raw("<br>".join(_h(line) for line in lines))


def _identity(run: Run) -> Raw:
    if not run.starts:
        p = run.promotion or {}
        return _section(
            "identity",
            "Identity",
            _table(
                None,
                [
                    ["contract", f"{p.get('contract', '?')} ({p.get('contract_digest') or 'digest not recorded'})"],
                    ["engine starts", "none recorded in this folder"],
                ],
                "identity",
            ),
        )
    first = run.starts[0]
    c = first.contract
    canonical = c.canonical
    spec = canonical.get("speculative") or {}
    prompts = canonical.get("prompts") or {}
    rows: list[list[Any]] = [
        ["run folder", str(run.folder)],
        ["contract", Raw(f"<b>{_h(c.name)}</b> ({_h(c.kind)})<br><code>{_h(c.digest)}</code>")],
        ["engine", f"vLLM {first.engine.vllm_version or 'n/a'}, torch {first.engine.torch_version or 'n/a'}"],
        ["machine", host.machine_line(first.host)],
        [
            "FP8 attention",
            " · ".join(
                f"start-{s.start_index}: {host.fp8_attention_ran(s.audits) or 'not recorded'}" for s in run.starts
            ),
        ],
        [
            "INT4 weights",
            " · ".join(f"start-{s.start_index}: {host.int4_path_ran(s.audits) or 'none'}" for s in run.starts),
        ],
        ["target", _model(first.target)],
        ["draft", _model(first.draft)],
        ["speculation", ", ".join(f"{k} {v}" for k, v in spec.items()) or "none"],
        [
            "prompt set",
            f"{prompts.get('file', '?')} v{prompts.get('version', '?')}, {prompts.get('count', '?')} "
            f"prompts, {(canonical.get('decode') or {}).get('tokens_per_request', '?')} tokens each",
        ],
        ["reproduction", ", ".join(f"{k} {v}" for k, v in (canonical.get("reproduction") or {}).items())],
    ]
    checked = (run.promotion or {}).get("checkpoint_tables_checked") or {}
    rows.append(
        [
            "checkpoint tables",
            "; ".join(f"{part}: {why}" for part, why in sorted(checked.items()))
            or "not checked against the checkpoints by the recorded verdict (taken on trust)",
        ]
    )
    if other := sorted({s.contract.digest for s in run.starts} - {c.digest}):
        rows.append(["warning", f"the starts were recorded under different contracts: {', '.join(other)}"])
    commands: dict[str, list[str]] = {}
    for s in run.starts:
        commands.setdefault(shlex.join(s.engine.command), []).append(f"start-{s.start_index}")
    env = "\n".join(f"{k}={v}" for k, v in sorted(first.engine.environment.items()))
    return _section(
        "identity",
        "Identity",
        _table(None, rows, "identity"),
        Raw("<h3>Engine command</h3>"),
        *(Raw(_p(", ".join(names) + ":") + _pre(cmd)) for cmd, names in commands.items()),
        Raw(
            f"<details><summary>Engine environment ({len(first.engine.environment)} variables)"
            f"</summary>{_pre(env)}</details>"
        ),
    )


def _starts(run: Run) -> Raw:
    rows = []
    figures = speed(run.starts)
    for s in run.starts:
        teardown = s.teardown or {}
        rows.append(
            [
                f"start-{s.start_index}",
                s.status,
                s.created_at,
                _num(s.ready_s, ".1f"),
                len(s.requests) + len(s.repeats),
                _num(_median(figures, run.starts, s)),
                _num(s.throughput.server_tokens_per_s),
                "clean" if teardown.get("clean") is True else ("not clean" if teardown else "not recorded"),
                s.failure.message if s.failure else "",
            ]
        )
    return _section(
        "starts",
        "Engine starts",
        _table(
            [
                "start",
                "status",
                "created",
                "ready (s)",
                "requests",
                "median decode (tok/s)",
                "server tok/s",
                "teardown",
                "failure",
            ],
            rows,
        )
        if rows
        else _p("No engine start was recorded in this folder."),
    )


def _subject_key(subject: str, prompts: list[str]) -> tuple:
    if subject == "run":
        return (0, 0, 0, 0, "")
    if (m := _SUBJECT.match(subject)) is None:
        return (2, 0, 0, 0, subject)
    start, rank, prompt = m.groups()
    if rank is not None:
        return (1, int(start), 1, int(rank), "")
    if prompt is not None:
        return (1, int(start), 2, prompts.index(prompt) if prompt in prompts else len(prompts), prompt)
    return (1, int(start), 0, 0, "")


def _cell(entries: list[dict[str, Any]], numbers: dict[int, int], required: bool, missing: bool) -> Raw:
    if not entries:
        return Raw(
            '<span class="cell missing">not run</span>' if missing or required else '<span class="cell na"></span>'
        )
    bad = [e for e in entries if e.get("outcome") != "passed"]
    if not bad:
        return Raw('<span class="cell pass">&#10003;</span>')
    e = bad[0]
    counts = e.get("outcome") == "failed" or required  # a required pair that was skipped is a failure
    mark, cls = ("&#10007;", "fail") if counts else ("skipped", "skip")
    return Raw(
        f'<a class="cell {cls}" href="#failure-{numbers[id(e)]}" title="{_h(e.get("reasons"))}">{mark} '
        f"{numbers[id(e)]}</a>"
    )


def _gates(run: Run) -> Raw:
    p = run.promotion
    if p is None:
        return _section("gates", "Gates", _p("No verdict recorded: no gate outcome to show."))
    outcomes = [g for g in p.get("gates") or [] if isinstance(g, dict)]
    required = {tuple(pair) for pair in p.get("required") or []}
    missing = {tuple(pair) for pair in p.get("missing") or []}
    failures = [g for g in outcomes if g.get("outcome") != "passed"]
    numbers = {id(g): i for i, g in enumerate(failures, 1)}
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for g in outcomes:
        if g.get("gate") and g.get("subject"):
            cells.setdefault((g["gate"], g["subject"]), []).append(g)
    pairs = set(cells) | required
    names = {gate for gate, _ in pairs}
    columns = [g for g in GATE_NAMES if g in names] + sorted(names - set(GATE_NAMES))
    prompts = prompt_order(run.starts)
    subjects = sorted({subj for _, subj in pairs}, key=lambda s: _subject_key(s, prompts))
    rows = [
        [s] + [_cell(cells.get((g, s), []), numbers, (g, s) in required, (g, s) in missing) for g in columns]
        for s in subjects
    ]
    checks = [g for g in outcomes if not (g.get("gate") and g.get("subject"))]
    parts: list[Any] = [
        _table(["subject"] + columns, rows, "matrix") if rows else _p("No gate test ran in this session."),
        _p(
            f"Evidence checks (gate-marked tests that check the evidence is all there): {len(checks)} ran, "
            f"{sum(1 for g in checks if g.get('outcome') == 'passed')} passed."
        ),
    ]
    if problems := p.get("problems") or []:
        parts.append(
            Raw("<h3>Problems of the verdict</h3><ul>" + "".join(f"<li>{_h(x)}</li>" for x in problems) + "</ul>")
        )
    if missing:
        parts.append(
            Raw(
                f"<h3>Required, did not run ({len(missing)})</h3><ul>"
                + "".join(f"<li>{_h(g)} [{_h(s)}]</li>" for g, s in sorted(missing))
                + "</ul>"
            )
        )
    if failures:
        parts.append(_failure_list(failures, numbers))
    return _section("gates", "Gates", *parts)


def _failure_list(failures: list[dict[str, Any]], numbers: dict[int, int]) -> Raw:
    """Every gate test that did not pass, numbered as the matrix links to it, with its whole message."""
    return Raw(
        f'<h3>Failures ({len(failures)})</h3><ol class="failures">'
        + "".join(
            f'<li id="failure-{numbers[id(g)]}"><b>{_h(g.get("gate") or "evidence check")}</b> '
            f"[{_h(g.get('subject') or '')}] {_h(g.get('outcome'))}: <code>{_h(g.get('test'))}</code>"
            f"{_pre(g.get('reasons') or '(no message)')}</li>"
            for g in failures
        )
        + "</ol>"
    )


class _Plots:
    """Plotly figures as page divs: the first carries plotly.js inline, the others use it."""

    RENDERED = "document.getElementById('{plot_id}').setAttribute('data-rendered', 'true');"

    def __init__(self) -> None:
        self.inlined = False

    def div(self, name: str, fig: Any) -> Raw:
        import plotly.io as pio

        fig.update_layout(template="plotly_white", margin={"t": 30, "r": 20}, legend={"font": {"size": 11}})
        body = pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=not self.inlined,
            div_id=f"plot-{name}",
            config={"displaylogo": False, "responsive": True},
            default_height="460px",
            post_script=self.RENDERED,
        )
        self.inlined = True
        return Raw(f'<div class="plot" data-plot="{name}">{body}</div>')


def _decode(run: Run, plots: _Plots) -> Raw:
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    starts = [s for s in run.starts if s.requests]
    title = "Decode rate per prompt"
    if not starts:
        return _section("decode-rate", title, _p("No request was recorded in any start: no decode rate to show."))
    prompts = prompt_order(starts)
    palette = qualitative.Plotly
    fig = go.Figure()
    for i, s in enumerate(starts):
        points = [(r.prompt_id, rate) for r in s.requests if (rate := decode_rate(s, r)) is not None]
        fig.add_trace(
            go.Scatter(
                x=[_label(p) for p, _ in points],
                y=[v for _, v in points],
                mode="markers",
                name=f"start-{s.start_index}",
                marker={"size": 11, "color": palette[i % len(palette)]},
            )
        )
    judged = _judged_speed(starts)
    figures, decisions = judged if judged is not None else (None, [])
    interleaved = any(s.schedule is not None for s in starts)
    notes = [
        "Each point is one request's (N - 1) / (t_N - t_1); a start's endpoint figure is its median."
        if not interleaved
        else "Each point is one request of pass 1, (N - 1) / (t_N - t_1); the starts were measured side by side "
        "(the interleaved schedule), and a start's endpoint figure is the median over prompts of each prompt's "
        "median over the passes."
    ]
    for i, s in enumerate(starts):
        if (m := _median(figures, starts, s)) is not None:
            fig.add_hline(
                y=m,
                line_dash="dash",
                line_color=palette[i % len(palette)],
                line_width=1.5,
                annotation_text=f"start-{s.start_index} median {m:.2f}",
                annotation_position=("top left", "bottom right", "top right", "bottom left")[i % 4],
            )
    ref = starts[0]
    m0 = _median(figures, starts, ref)
    if m0 is not None and decisions:
        tol = decisions[0].endpoint_tolerance
        fig.add_hrect(
            y0=m0 * (1 - tol), y1=m0 * (1 + tol), fillcolor="#2ca02c", opacity=0.12, line_width=0, layer="below"
        )
        notes.append(
            f"Shaded: start-{ref.start_index}'s median {m0:.2f} tok/s ± {tol:.0%} "
            f"({m0 * (1 - tol):.2f} - {m0 * (1 + tol):.2f} tok/s), the band fresh-start reproduction "
            "accepts for every later start's median."
        )
        for d in decisions:
            if d.endpoint is not None and d.endpoint_drift is not None:
                notes.append(
                    f"start-{d.start}: {d.endpoint:.2f} tok/s, {d.endpoint_drift:.1%} from start-{ref.start_index}: "
                    + ("inside the band." if d.endpoint_within else "OUTSIDE the band.")
                )
    for d in decisions:
        if (paired := d.paired) is not None:
            where = (
                f"; its {paired.confidence * 100:g} % interval must lie inside 1 +/- {d.paired_tolerance:g} "
                "(equivalence rule): "
                if d.rule == "equivalence"
                else f"; tolerance {d.paired_tolerance:.0%}: "
            ) + ("inside." if d.paired_within else "OUTSIDE.")
            notes.append(
                f"Paired figure start-{d.start} / start-{ref.start_index} {paired.line()}: the "
                f"geometric mean of the per-prompt decode-rate ratios (from the arrival times"
                + ("; each prompt's median over the passes of its side-by-side ratio" if interleaved else "")
                + f"), {paired.drift:.1%} from 1{where}"
            )
    fig.update_layout(
        xaxis={"title": "prompt", "categoryorder": "array", "categoryarray": [_label(p) for p in prompts]},
        yaxis={"title": "decode rate (tok/s)", "rangemode": "tozero"},
    )
    rates = {(s.start_index, r.prompt_id): decode_rate(s, r) for s in starts for r in s.requests}
    rows = [[p] + [_num(rates.get((s.start_index, p))) for s in starts] for p in prompts]
    rows.append([Raw("<b>median</b>")] + [_num(_median(figures, starts, s)) for s in starts])
    return _section(
        "decode-rate",
        title,
        plots.div("decode-rate", fig),
        *(_p(n, "note") for n in notes),
        _table(["prompt"] + [f"start-{s.start_index} (tok/s)" for s in starts], rows, "numbers"),
    )


def _timeline(run: Run, plots: _Plots) -> Raw:
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    title = "Token arrival per prompt"
    starts = [s for s in run.starts if s.requests]
    if not starts:
        return _section("timeline", title, _p("No request was recorded in any start: no token arrival to show."))
    prompts = prompt_order(starts)
    palette, dashes = qualitative.Plotly, ["solid", "dot", "dash", "longdash", "dashdot"]
    fig, notes = go.Figure(), []
    for si, s in enumerate(starts):
        for r in s.requests:
            times, tokens = arrival(r)
            if len(r.chunk_times) != len(r.chunk_tokens):
                notes.append(
                    f"start-{s.start_index} {r.prompt_id}: {len(r.chunk_times)} chunk times but "
                    f"{len(r.chunk_tokens)} chunk token counts; the first {len(times)} are plotted."
                )
            color = palette[prompts.index(r.prompt_id) % len(palette)]
            fig.add_trace(
                go.Scatter(
                    x=times,
                    y=tokens,
                    mode="lines+markers",
                    line_shape="hv",
                    name=_label(f"{r.prompt_id} · start-{s.start_index}"),
                    legendgroup=_label(r.prompt_id),
                    marker={"size": 5},
                    line={"color": color, "dash": dashes[si % len(dashes)], "width": 1.5},
                )
            )
    fig.update_layout(
        xaxis={"title": "seconds since the request began"},
        yaxis={"title": "tokens received (cumulative)", "rangemode": "tozero"},
    )
    notes.insert(
        0,
        "One point per streamed chunk; a step taller than one token is a chunk that carried accepted "
        "draft tokens. Line style tells the starts apart, colour the prompts.",
    )
    return _section("timeline", title, plots.div("token-timeline", fig), *(_p(n, "note") for n in notes))


def _acceptance(run: Run, plots: _Plots) -> Raw:
    import plotly.graph_objects as go

    title = "Acceptance per draft position"
    if run.starts and all(s.draft is None for s in run.starts):
        return _section("acceptance", title, _p("The contract does not speculate: there is no draft to accept."))
    found = [(s, acceptance(s.metrics_before, s.metrics_after)) for s in run.starts if s.status == "ok"]
    judged = [(s, a) for s, a in found if isinstance(a, Acceptance)]
    notes = [f"start-{s.start_index}: acceptance cannot be told: {a}" for s, a in found if isinstance(a, str)]
    if not judged:
        return _section("acceptance", title, *(_p(n, "note") for n in notes or ["No start recorded /metrics."]))
    fig = go.Figure()
    for i, (s, a) in enumerate(judged):  # starts often accept alike: open markers and dashes keep both visible
        fig.add_trace(
            go.Scatter(
                x=list(a.rates),
                y=list(a.rates.values()),
                mode="lines+markers",
                name=f"start-{s.start_index}",
                line={"dash": ("solid", "dash", "dot")[i % 3]},
                marker={"size": 12 - 3 * (i % 3), "symbol": ("circle-open", "circle", "diamond")[i % 3]},
            )
        )
        total = sum(a.accepted.values())
        notes.append(
            f"start-{s.start_index}: {a.drafts:g} drafts, {total:g} draft tokens accepted "
            f"({total / a.drafts:.2f} per draft)."
        )
    fig.update_layout(
        xaxis={"title": "draft position (0: the first drafted token)", "dtick": 1},
        yaxis={"title": "accepted / drafts", "range": [0, 1.05]},
    )
    notes.insert(
        0,
        "At position k: tokens accepted there over the run, divided by the drafts proposed (vLLM's "
        f"{ACCEPTED_PER_POS} and {DRAFTS}, after the prompts minus before).",
    )
    positions = sorted({pos for _, a in judged for pos in a.accepted})
    rows = [
        [pos] + [f"{a.accepted[pos]:g} ({a.rates[pos]:.1%})" if pos in a.accepted else "n/a" for _, a in judged]
        for pos in positions
    ]
    return _section(
        "acceptance",
        title,
        plots.div("acceptance", fig),
        *(_p(n, "note") for n in notes),
        _table(["position"] + [f"start-{s.start_index} accepted (rate)" for s, _ in judged], rows, "numbers"),
    )


def _quality(run: Run) -> Raw | None:
    q = (run.promotion or {}).get("quality")
    recorded = [f"start-{s.start_index}: {len(s.quality)}" for s in run.starts if s.quality]
    if not isinstance(q, dict) and not recorded:
        return None
    parts: list[Any] = []
    if recorded:
        parts.append(_p(f"Quality answers recorded: {', '.join(recorded)}."))
    if not isinstance(q, dict):
        parts.append(
            _p(
                "Not judged in this run's promotion.json: replay gate 8 with pytest -m quality --b70-evidence RUN_DIR.",
                "verdict-text incomplete",
            )
        )
        return _section("quality", "Quality (gate 8)", *parts)
    status = str(q.get("status", "?"))
    cls = {"ok": "pass", "regressed": "fail"}.get(status, "incomplete")
    details = [
        f"regressed: {', '.join(q.get('regressed') or [])}" if q.get("regressed") else "",
        f"did not run: {', '.join(q.get('missing') or [])}" if q.get("missing") else "",
        "; ".join(q.get("problems") or []),
    ]
    parts.append(_p(f"QUALITY {status.upper()}" + "".join(f" - {d}" for d in details if d), f"verdict-text {cls}"))
    layers = q.get("sandbox_layers")
    if isinstance(layers, list):
        from ..judge.verdict import sandbox_line

        line, markup = sandbox_line([str(x) for x in layers], bool(q.get("unisolated_allowed")))
        parts.append(_p(line.strip(), "verdict-text incomplete" if markup else ""))
    rows = []
    for f in q.get("figures") or []:
        o = f.get("observed") or {}
        shown = (
            f"{o.get('candidate_passed')}/{o['samples']} vs baseline {o.get('baseline_passed')}/{o['samples']}"
            if o.get("samples") is not None
            else "not judged"
        )
        rows.append(
            [
                f.get("figure"),
                f.get("outcome"),
                shown,
                _num(o.get("p_value"), ".3g"),
                o.get("lost", ""),
                o.get("gained", ""),
                f.get("reasons") or "",
            ]
        )
    parts.append(
        _table(["figure", "outcome", "candidate vs baseline", "p-value", "lost", "gained", "reasons"], rows, "numbers")
    )
    return _section("quality", "Quality (gate 8)", *parts)


# --- the page ---------------------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1320px; padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; } td { word-break: break-word; }
table.identity td:first-child { font-weight: 600; white-space: nowrap; }
table.matrix { font-size: 12px; } table.matrix th { max-width: 90px; } table.matrix td { text-align: center; }
table.matrix td:first-child { text-align: left; white-space: nowrap; } table.numbers td { text-align: right; }
table.numbers td:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 6px 8px; white-space: pre-wrap; word-break: break-all; margin: 4px 0; }
.verdict { font-size: 18px; font-weight: 700; padding: 12px 16px; border-radius: 6px; margin: 12px 0; }
.pass { color: #116329; } .fail { color: #b31d28; } .skip { color: #8a5a00; } .incomplete, .none { color: #8a5a00; }
div.verdict.pass { background: #e6f4ea; } div.verdict.fail { background: #fde8e8; }
div.verdict.incomplete, div.verdict.none { background: #fff4d6; }
.verdict-text { font-weight: 700; } .note { color: #555; margin: 4px 0; }
.cell { display: inline-block; min-width: 18px; text-decoration: none; font-weight: 700; }
.cell.missing { color: #8a5a00; font-weight: 400; } .plot { margin: 8px 0; }
"""


def render(run: Run) -> str:
    """The whole page as one string."""
    plots = _Plots()
    cls, line = headline(run)
    name = run.starts[0].contract.name if run.starts else (run.promotion or {}).get("contract", "?")
    sections = [
        _identity(run),
        _starts(run),
        _gates(run),
        _decode(run, plots),
        _timeline(run, plots),
        _acceptance(run, plots),
        _quality(run),
    ]
    body = "".join(s for s in sections if s is not None)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>b70lab report - {_h(run.folder.name)} - {_h(name)}</title><style>{CSS}</style></head><body>"
        f"<h1>b70lab promotion report: {_h(run.folder.name)}</h1>"
        f'<div class="verdict {cls}" id="verdict">{_h(line)}</div>{body}</body></html>\n'
    )


def write(folder: Path, out: Path | None = None) -> Path:
    """Render the run folder to `out` (default RUN_DIR/report.html); returns the path written."""
    run = load(folder)
    out = Path(out) if out is not None else Path(folder) / FILENAME
    text = render(run)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e.strerror or e}") from e
    return out
