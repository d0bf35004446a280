"""The report page: one self-contained HTML file (plotly.js inlined, so it opens with no network) with
a panel per quantity, an x-axis switch between wall time and policy version, and tables of sample
experiences and rejected records."""

from __future__ import annotations

import html
import json
from pathlib import Path

from undertow.infra.report.archive import ArchiveTables
from undertow.infra.report.series import Curve, Panel

X_TITLES = {"time": "seconds since the run started", "version": "policy version (of its stage)"}
RAW_OPACITY = 0.25  # the raw series stays visible behind its smoothed curve without hiding it

# Switching the x-axis swaps every trace's x for the other array it carries in `meta`.
SWITCH_JS = """
function undertowAxis(axis) {
  document.querySelectorAll('.panel .plotly-graph-div').forEach(function (gd) {
    Plotly.restyle(gd, {x: gd.data.map(function (t) { return t.meta['x_' + axis]; })});
    Plotly.relayout(gd, {'xaxis.title.text': %s[axis]});
  });
  document.body.dataset.axis = axis;
}
document.querySelectorAll('input[name=xaxis]').forEach(function (input) {
  input.addEventListener('change', function () { undertowAxis(input.value); });
});
""" % json.dumps(X_TITLES)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.panels { display: grid; grid-template-columns: repeat(auto-fill, minmax(620px, 1fr)); gap: 1em; }
.panel { border: 1px solid #ddd; border-radius: 6px; padding: .4em; }
.note { color: #666; font-size: .9em; }
table { border-collapse: collapse; font-size: .85em; margin-bottom: 1.5em; }
td, th { border: 1px solid #ddd; padding: .2em .5em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.switch { position: sticky; top: 0; background: #fff; padding: .5em 0; z-index: 10; }
"""


def figure(panel: Panel, colors: list[str]):
    """A plotly figure: per curve its raw series faint and its smoothed one on top, same colour (shares:
    stacked areas); a second y-axis for curves of another scale; the run's alerts as marks."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, c in enumerate(panel.curves):
        color, axis = colors[i % len(colors)], "y2" if c.right else "y"
        if panel.stacked:
            fig.add_trace(go.Scatter(x=c.times, y=c.smoothed or c.values, name=c.label, mode="lines",
                                     stackgroup="shares", line={"color": color, "width": 1}, meta=_meta(c, "stacked")))
            continue
        few = c.smoothed is None and len(c.values) < 20
        fig.add_trace(go.Scatter(
            x=c.times, y=c.values, name=c.label, legendgroup=c.label, showlegend=c.smoothed is None, yaxis=axis,
            mode="lines+markers" if few else "lines", line={"color": color, "width": 1 if c.smoothed else 1.5},
            opacity=RAW_OPACITY if c.smoothed else 1.0, meta=_meta(c, "raw")))
        if c.smoothed is not None:
            fig.add_trace(go.Scatter(x=c.times, y=c.smoothed, name=c.label, legendgroup=c.label, mode="lines",
                                     yaxis=axis, line={"color": color, "width": 2}, meta=_meta(c, "smoothed")))
    if panel.marks:
        fig.add_trace(_alerts(panel))
    fig.update_layout(title={"text": panel.title + (f"<br><sub>{panel.note}</sub>" if panel.note else "")},
                      xaxis_title=X_TITLES["time"], yaxis_title=panel.y_title, height=420,
                      margin={"l": 60, "r": 60 if panel.right_title else 10, "t": 60, "b": 50},
                      legend={"font": {"size": 10}}, template="plotly_white", hovermode="closest")
    if panel.right_title:
        fig.update_layout(yaxis2={"title": {"text": panel.right_title}, "overlaying": "y", "side": "right",
                                  "showgrid": False, "rangemode": "tozero"})
    return fig


def _alerts(panel: Panel):
    """The watchers' alerts as red crosses along the top of the panel, the alert in their hover text."""
    import plotly.graph_objects as go

    left = [v for c in panel.curves if not c.right for v in (c.values if not panel.stacked else [1.0])]
    top = max(left, default=1.0)
    marks = panel.marks
    return go.Scatter(x=[m.time for m in marks], y=[top] * len(marks), name="watcher alerts", mode="markers",
                      marker={"symbol": "x", "size": 10, "color": "#d62728"}, text=[m.label for m in marks],
                      customdata=[m.detail for m in marks], hovertemplate="%{text}<br>%{customdata}<extra></extra>",
                      meta={"series": "alerts", "kind": "alert", "x_time": [m.time for m in marks],
                            "x_version": [m.version for m in marks], "labels": [m.label for m in marks]})


def _meta(c: Curve, kind: str) -> dict:
    return {"series": c.label, "kind": kind, "x_time": c.times, "x_version": c.versions}


def render(title: str, header: list[str], panels: list[Panel], archive: ArchiveTables | None) -> str:
    """The whole page as one HTML string."""
    import plotly.colors
    import plotly.io as pio

    colors = plotly.colors.qualitative.D3
    divs = []
    for i, panel in enumerate(panels):
        snippet = pio.to_html(figure(panel, colors), include_plotlyjs=i == 0, full_html=False,
                              div_id=f"panel-{panel.key}", config={"displaylogo": False})
        divs.append(f'<div class="panel" data-panel="{panel.key}">{snippet}</div>')
    switch = "".join(f'<label><input type="radio" name="xaxis" value="{axis}"{" checked" if axis == "time" else ""}>'
                     f" {text}</label> " for axis, text in X_TITLES.items())
    body = [f"<h1>{html.escape(title)}</h1>", *(f'<p class="note">{html.escape(h)}</p>' for h in header),
            f'<div class="switch">x-axis: {switch}</div>', f'<div class="panels">{"".join(divs)}</div>',
            *tables(panels, archive)]
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body data-axis=\"time\">{''.join(body)}<script>{SWITCH_JS}</script>"
            "</body></html>")


def tables(panels: list[Panel], archive: ArchiveTables | None) -> list[str]:
    """The sample experiences and rejected records, or, with no archive, the metrics' rejection counts."""
    if archive is None:
        counts = next((p.curves for p in panels if p.key == "rejections"), [])
        rows = [{"series": c.label, "count at the end": c.values[-1]} for c in counts]
        return ["<h2>Sample experiences</h2>",
                '<p class="note" id="no-archive">This run kept no archive (<code>run.archive: false</code>): there '
                "are no sample experiences or rejected records to show. The rejections here are from the "
                "metrics only: the counters each stage reported.</p>",
                "<h2>Rejections (from metrics only)</h2>", table("rejected-counts", rows)]
    return ["<h2>Sample experiences</h2>",
            f'<p class="note">{len(archive.samples)} experiences spread evenly over the run, from the archive '
            f"({html.escape(str(archive.root))}); advantage is the mean over the response tokens.</p>",
            table("samples", archive.samples),
            "<h2>Rejected records by stage and reason</h2>", table("rejected-reasons", archive.rejected_by_reason),
            f"<h2>Rejected records (the first {len(archive.rejected)})</h2>", table("rejected", archive.rejected)]


def table(table_id: str, rows: list[dict]) -> str:
    if not rows:
        return f'<table id="{table_id}"><tr><td>none</td></tr></table>'
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(_cell(v) for v in r.values()) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{html.escape('' if value is None else str(value))}</td>"


def write_page(path: Path, title: str, header: list[str], panels: list[Panel], archive: ArchiveTables | None) -> Path:
    path.write_text(render(title, header, panels, archive), encoding="utf-8")
    return path
