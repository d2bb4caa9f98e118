"""Self-contained HTML pages of plotly figures (works offline, e.g. opened from a cluster).

plotly.js is inlined once in <head>; each figure is embedded as a div without
its own copy, so a page with many charts costs one bundle (~5 MB), not many.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.messages import escape_controls
from sim.files import write_bytes_atomic

if TYPE_CHECKING:  # plotly is imported only to draw: tables and summaries need none (the GPU image lacks it)
    import plotly.graph_objects as go

PAGE_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 1rem 2rem; color: #222; }
h1 { margin-bottom: 0.2rem; }
.subtitle { color: #555; margin-top: 0; }
table.summary { border-collapse: collapse; margin: 0.5rem 2rem 1rem 0; display: inline-table; vertical-align: top; }
table.summary th, table.summary td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
table.summary thead th { background: #f3f3f3; }
.figure { margin: 1.5rem 0; }
"""

_PLOT_CONFIG = {"displaylogo": False, "responsive": True}

# Scattergl draws with WebGL; a browser without it (headless, remote desktops, some VMs) would show
# "WebGL is not supported" instead of the chart. Without WebGL, draw those traces as SVG scatter: slower
# with many points, but drawn. Runs before any figure's Plotly.newPlot call.
WEBGL_FALLBACK_JS = """(function () {
  var gl = null;
  try {
    var canvas = document.createElement("canvas");
    gl = canvas.getContext("webgl") || canvas.getContext("experimental-webgl");
  } catch (e) { gl = null; }
  document.documentElement.setAttribute("data-webgl", gl ? "yes" : "no");
  if (gl) { return; }
  function svg(data) {
    return (data || []).map(function (t) {
      return t && t.type === "scattergl" ? Object.assign({}, t, {type: "scatter"}) : t;
    });
  }
  ["newPlot", "react"].forEach(function (name) {
    var original = Plotly[name];
    Plotly[name] = function (gd, data, layout, config) { return original.call(Plotly, gd, svg(data), layout, config); };
  });
})();"""


def html_text(text: object) -> str:
    """``text`` (a trace's file name, a run's model, a summary.json string) as escaped HTML text, its control
    characters written as repr writes them: an ANSI escape or a carriage return in a name went into the page raw, which
    HTML does not allow (a parse error, shown as a box or nothing)."""
    return html.escape(escape_controls(text))


def _figure_div(fig: go.Figure) -> str:
    height = fig.layout.height
    return fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG, default_width="100%",
                       default_height=f"{int(height)}px" if height else "500px")


def write_html(figures: Sequence[go.Figure], path: str | Path, title: str, header_html: str = "") -> Path:
    """Write `figures` below a title and `header_html` (trusted HTML) to one offline page, creating parent
    directories; returns the path written."""
    from plotly.offline import get_plotlyjs

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    divs = "\n".join(f'<div class="figure">{_figure_div(fig)}</div>' for fig in figures)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html_text(title)}</title>\n<style>{PAGE_STYLE}</style>\n"
        f'<script type="text/javascript">{get_plotlyjs()}</script>\n'
        f'<script type="text/javascript">{WEBGL_FALLBACK_JS}</script>\n</head>\n<body>\n'
        f"<header>\n<h1>{html_text(title)}</h1>\n{header_html}\n</header>\n"
        f"<main>\n{divs}\n</main>\n</body>\n</html>\n"
    )
    # A path given on the command line may hold bytes that are not UTF-8 (a surrogate in Python's str): shown
    # as \udcff, as error messages show them, instead of failing the whole report at its last write.
    write_bytes_atomic(path, page.encode("utf-8", "backslashreplace"))
    return path


def table_html(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, caption: str | None = None,
               raw_cells: bool = False) -> str:
    """An HTML table in the pages' `summary` style; cells are escaped text, or trusted `<td>` HTML
    with `raw_cells` (for cells with attributes)."""
    cap = f"<caption>{html_text(caption)}</caption>" if caption else ""
    head = "<thead><tr>" + "".join(f"<th>{html_text(h)}</th>" for h in header) + "</tr></thead>" if header else ""
    cells = (("".join(row) if raw_cells else "".join(f"<td>{html_text(cell)}</td>" for cell in row)) for row in rows)
    body = "".join(f"<tr>{row}</tr>" for row in cells)
    return f'<table class="summary">{cap}{head}<tbody>{body}</tbody></table>'
