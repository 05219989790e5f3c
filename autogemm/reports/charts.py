"""The page of `autogemm report`: Plotly figures of what `report` gathered, in one HTML file that
works offline (Plotly's JavaScript embedded once; no reference to anything outside the file).

Each figure travels as JSON in a `<script type="application/json">` beside its `<div>`, and one
script at the end draws them all: the data stay readable by a test (and by anyone curious) without
executing anything. Every string that came from a study, a cache or a results file is
HTML-escaped, in the page and in the figures (Plotly reads a few tags in its labels).
"""

from __future__ import annotations

import datetime
import html
import json
from typing import Any

from .measured import group_of, intensity, shape_of

INSTALL_HINT = "pip install 'autogemm[report]'"
# nothing in the mode bar that leads off the page (Plotly's logo links to its site)
CONFIG = {"displaylogo": False, "responsive": True, "showLink": False, "showSendToCloud": False,
          "showEditInChartStudio": False}
# one colour per dtype/compute in the roofline, for our points, cuBLAS's and the ceiling alike
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
TEMPLATE = "plotly_white"


class PlotlyMissing(ImportError):
    """Plotly (the optional extra `report`) is not installed."""


def plotly() -> Any:
    """The plotly package; PlotlyMissing naming the extra where it is not installed."""
    try:
        import plotly  # (lazy: plotly, an extra)
        import plotly.graph_objects  # noqa: F401
    except ImportError as exc:
        raise PlotlyMissing(f"autogemm report draws its charts with Plotly, which cannot be imported ({exc}); "
                            f"install it with {INSTALL_HINT}") from None
    return plotly


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


class Page:
    """The figures of a page, numbered in order, each as a div and its JSON."""

    def __init__(self):
        self.count = 0

    def chart(self, kind: str, figure: Any) -> str:
        self.count += 1
        import plotly.io  # (lazy: plotly, an extra)

        figure.update_layout(template=TEMPLATE, margin=dict(l=60, r=20, t=50, b=60), height=380)
        # "<" never appears in the JSON as such, so nothing in it can close the script element
        data = plotly.io.to_json(figure, validate=True).replace("<", "\\u003c").replace(">", "\\u003e")
        ident = f"chart-{self.count}"
        return (f'<div class="chart" id="{ident}" data-chart="{kind}"></div>\n'
                f'<script type="application/json" class="figure" data-for="{ident}" data-chart="{kind}">{data}</script>')


def history_figure(history: Any, cublas_tflops: Any) -> Any:
    go = plotly().graph_objects
    numbers = [number for number, _ in history.trials]
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=numbers, y=[value for _, value in history.trials], mode="markers",
                                name="measured trial", marker=dict(size=6, opacity=0.7)))
    figure.add_trace(go.Scatter(x=numbers, y=history.running_best, mode="lines", line_shape="hv", name="best so far"))
    if cublas_tflops and numbers:
        figure.add_trace(go.Scatter(x=[min(numbers), max(numbers)], y=[cublas_tflops, cublas_tflops], mode="lines",
                                    line=dict(dash="dash", color="black"), name="cuBLAS (cache record's run)"))
    figure.update_layout(title=f"Tuning history: {esc(history.space)} ({len(numbers)} measured trials)",
                         xaxis_title="trial number", yaxis_title="TFLOP/s")
    return figure


def importance_figure(history: Any) -> Any:
    go = plotly().graph_objects
    names = list(history.importances)[::-1]  # the most important on top
    figure = go.Figure(go.Bar(x=[history.importances[n] for n in names], y=[esc(n) for n in names], orientation="h",
                              name="importance"))
    figure.update_layout(title="Parameter importances (PED-ANOVA)", xaxis_title="share of the importance")
    return figure


def failure_figure(history: Any) -> Any:
    go = plotly().graph_objects
    kinds = list(history.failures)
    figure = go.Figure(go.Bar(x=[esc(k) for k in kinds], y=[history.failures[k] for k in kinds], name="candidates"))
    figure.update_layout(title="Failures by kind (distinct candidates; rejected: refused before compiling)",
                         yaxis_title="candidates")
    return figure


def roofline_points(device: Any) -> Any:
    """(problem, our TFLOP/s, cuBLAS's or None) of each reported problem with a winner."""
    return [(p.problem, p.winner.tflops, p.winner.cublas_tflops) for p in device.problems if p.winner]


def roofline_figure(device: Any) -> Any:
    go = plotly().graph_objects
    points = roofline_points(device)
    figure = go.Figure()
    groups = sorted({group_of(p) for p, _, _ in points})
    colour = {group: COLOURS[i % len(COLOURS)] for i, group in enumerate(groups)}
    for group in groups:
        mine = [(p, ours, theirs) for p, ours, theirs in points if group_of(p) == group]
        figure.add_trace(go.Scatter(x=[intensity(p) for p, _, _ in mine], y=[ours for _, ours, _ in mine],
                                    mode="markers", name=f"autogemm {esc(group)}", text=[esc(shape_of(p)) for p, _, _ in mine],
                                    marker=dict(size=11, color=colour[group])))
        theirs = [(p, t) for p, _, t in mine if t]
        if theirs:
            figure.add_trace(go.Scatter(x=[intensity(p) for p, _ in theirs], y=[t for _, t in theirs], mode="markers",
                                        name=f"cuBLAS {esc(group)}", text=[esc(shape_of(p)) for p, _ in theirs],
                                        marker=dict(size=11, symbol="x-thin", line=dict(width=2, color=colour[group]))))
    ceilings = {g: device.compute_ceilings[g] for g in groups if g in device.compute_ceilings}
    bandwidth = device.bandwidth.value if device.bandwidth else None  # GB/s x flop/byte = GFLOP/s

    def ridge(tflops: float) -> float:  # the intensity where the bandwidth line meets a ceiling
        return tflops * 1000 / bandwidth

    xs = [intensity(p) for p, _, _ in points] + ([ridge(c.value) for c in ceilings.values()] if bandwidth else [])
    low, high = min(xs) / 4, max(xs) * 4
    for group, ceiling in ceilings.items():
        start = ridge(ceiling.value) if bandwidth else low  # a roof: flat from where the slope meets it
        figure.add_trace(go.Scatter(x=[start, high], y=[ceiling.value, ceiling.value], mode="lines",
                                    line=dict(dash="dot", color=colour[group]),
                                    name=f"{esc(group)} best measured {ceiling.value:.1f}"))
    if bandwidth:
        top = max([c.value for c in ceilings.values()] or [max(y for _, y, _ in points)])
        figure.add_trace(go.Scatter(x=[low, ridge(top)], y=[bandwidth * low / 1000, top], mode="lines",
                                    line=dict(dash="dash", color="gray"), name=f"bandwidth {bandwidth:.0f} GB/s"))
    figure.update_layout(title="Roofline: the reported problems' winners and cuBLAS", xaxis_type="log",
                         yaxis_type="log", xaxis_title="arithmetic intensity (flop per byte moved)",
                         yaxis_title="TFLOP/s")
    return figure


def sweep_figure(device: Any) -> Any:
    go = plotly().graph_objects
    figure = go.Figure()
    for group in sorted({p.group for p in device.sweep}):
        mine = [p for p in device.sweep if p.group == group]
        figure.add_trace(go.Bar(x=[esc(p.shape) for p in mine], y=[p.ratio for p in mine], name=esc(group)))
    figure.add_hline(y=1.0, line_dash="dash", line_color="black")
    figure.update_layout(title="Ratio to cuBLAS per shape", yaxis_title="× cuBLAS (higher is better)",
                         barmode="group", xaxis_tickangle=-45, height=460)
    return figure


def _winner_table(winner) -> str:
    if winner is None:
        return "<p>No winner: no cache record and no measured trial.</p>"
    rows = [("source", winner.source), ("config", winner.config_name), ("serves", winner.serves),
            ("TFLOP/s", f"{winner.tflops:.2f}"),
            ("cuBLAS TFLOP/s", f"{winner.cublas_tflops:.2f}" if winner.cublas_tflops else "not measured"),
            ("ratio to cuBLAS", f"{winner.ratio:.3f}x" if winner.ratio else "not measured"),
            ("relative error", f"{winner.rel_error:.2e}" if winner.rel_error is not None else "not recorded"),
            *winner.timing,
            ("date", winner.date or "-"),
            ("knobs", ", ".join(f"{k}={v}" for k, v in winner.knobs.items()) or "-")]
    return "<table class=\"facts\">" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _profile_table(outcome) -> str:
    if outcome.error:
        return f"<p class=\"note\">Nsight Compute: {esc(outcome.error)}</p>"
    columns = outcome.kernels
    head = "".join(f"<th>{esc(k.side)}<br><code title=\"{esc(k.kernel)}\">{esc(k.kernel[:60])}</code></th>" for k in columns)
    body = "".join(f"<tr><th>{esc(label)}</th>" + "".join(f"<td>{esc(k.shown(metric))}</td>" for k in columns) + "</tr>"
                   for metric, label in outcome.metrics.items())
    return f"<table class=\"profile\"><tr><th>Nsight Compute</th>{head}</tr>{body}</table>"


def _problem_section(page: Page, problem, profile) -> str:
    parts = [f"<section class=\"problem\"><h3 id=\"{esc(problem.device)}/{esc(problem.problem.key)}\">"
             f"{esc(problem.problem.key)}</h3>", _winner_table(problem.winner)]
    if profile is not None:
        parts.append(_profile_table(profile))
    cublas = problem.winner.cublas_tflops if problem.winner else None
    if not problem.studies:
        parts.append("<p class=\"note\">No study of this problem in the storage: the figures are its cache "
                     "record's (trial curves come with the study, where the tune ran).</p>")
    for history in problem.studies:
        parts.append(f"<h4>{esc(shape_of(problem.problem))}, space {esc(history.space)} "
                     f"<span class=\"study\">study {esc(history.name)}</span></h4>")
        parts.append(page.chart("history", history_figure(history, cublas)) if history.trials
                     else "<p class=\"note\">No measured trial in this study.</p>")
        parts.append(page.chart("importance", importance_figure(history)) if history.importances
                     else f"<p class=\"note\">Parameter importances skipped: {esc(history.importance_note)}.</p>")
        parts.append(page.chart("failures", failure_figure(history)) if history.failures
                     else "<p class=\"note\">No failed or rejected candidate.</p>")
    return "\n".join(parts) + "</section>"


def _ceiling_notes(device) -> str:
    lines = [f"{esc(group)}: {c.value:.1f} TFLOP/s, {esc(c.source)}" for group, c in sorted(device.compute_ceilings.items())]
    lines += [f"{esc(group)}: none (no cache record or benchmark result of it)"
              for group in sorted({group_of(p) for p, _, _ in roofline_points(device)} - set(device.compute_ceilings))]
    bandwidth = (f"Bandwidth ceiling: {device.bandwidth.value:.0f} GB/s, {esc(device.bandwidth.source)}."
                 if device.bandwidth else
                 "No bandwidth line: no measured bandwidth was found for this device (give --bandwidth GB/s, or a "
                 "benchmark results file that measured it with --bench).")
    return ("<p class=\"note\">Compute ceilings are the best TFLOP/s measured per dtype and compute mode in this "
            "device's cache records and benchmark results, not a datasheet peak: " + ("; ".join(lines) or "none") +
            f". {bandwidth} Intensity = 2·M·N·K·batch / (itemsize·batch·(MK+KN+MN)).</p>")


def _device_section(page: Page, device, profiles: dict[str, Any]) -> str:
    parts = [f"<section class=\"device\"><h2>{esc(device.name)} <span class=\"study\">{esc(device.slug)}</span></h2>",
             "<h3>Across problems</h3>"]
    parts.append(page.chart("roofline", roofline_figure(device)) if roofline_points(device)
                 else "<p class=\"note\">No roofline: no reported problem has a winner.</p>")
    parts.append(_ceiling_notes(device))
    parts.append(page.chart("sweep", sweep_figure(device)) if device.sweep
                 else "<p class=\"note\">No shape sweep: no benchmark results and no current cache record.</p>")
    parts.append(f"<p class=\"note\">Shape sweep from {esc(device.sweep_source)}.</p>")
    for problem in device.problems:
        parts.append(_problem_section(page, problem, profiles.get((device.slug, problem.problem.key))))
    return "\n".join(parts) + "</section>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h2 { border-bottom: 2px solid #444; margin-top: 2em; } h3 { margin-top: 1.6em; }
.study { font-size: 0.7em; color: #777; font-weight: normal; }
.note { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { white-space: nowrap; }
.chart { width: 100%; }
"""

DRAW = """
document.querySelectorAll('script.figure').forEach(function (node) {
  var figure = JSON.parse(node.textContent);
  Plotly.newPlot(node.getAttribute('data-for'), figure.data, figure.layout, %s);
});
"""


def render_page(report: Any, profiles: dict[str, Any] | None = None) -> str:
    """The whole page; `profiles` maps (device slug, problem key) to a profile.ProfileOutcome."""
    from plotly.offline import get_plotlyjs  # (lazy: plotly, an extra)

    plotly()
    page = Page()
    body = [_device_section(page, device, profiles or {}) for device in report.devices]
    skipped = (f"<p class=\"note\">Not shown: {len(report.skipped)} studies not named as autogemm names them "
               f"(device:problem:space:template): {esc(', '.join(report.skipped[:10]))}"
               + (", ..." if len(report.skipped) > 10 else "") + ".</p>") if report.skipped else ""
    contents = "".join(f"<li>{esc(d.name)}: " + ", ".join(f"<a href=\"#{esc(d.slug)}/{esc(p.problem.key)}\">"
                                                          f"{esc(p.problem.key)}</a>" for p in d.problems) + "</li>"
                       for d in report.devices)
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">", "<title>autogemm report</title>",
        f"<style>{STYLE}</style>",
        f"<script>{get_plotlyjs()}</script>", "</head><body>",
        "<h1>autogemm report</h1>",
        f"<p class=\"note\">Written {datetime.datetime.now():%Y-%m-%d %H:%M} from {esc(report.storage)} "
        "and the tuned-results cache.</p>", skipped, f"<ul>{contents}</ul>",
        *body, f"<script>{DRAW % json.dumps(CONFIG)}</script>", "</body></html>", ""])
