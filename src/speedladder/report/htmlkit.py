"""The pieces report.html and compare's page are made of: escaping, tables, inline SVG charts, the page itself.

Nothing is fetched: the styling is inline, charts are matplotlib figures
inlined as SVG, and there is no script.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Iterable, Sequence

# The page's only styling, inline. A system font stack: nothing to fetch.
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 1.5em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; border-bottom: 1px solid #ddd; margin-top: 2em; }
p.glance { margin: 0.2em 0 0.6em; color: #444; font-size: 0.92em; }
p.trust { font-size: 0.9em; margin: 0.4em 0; padding: 0.4em 0.8em; background: #f6f6f6; border-radius: 4px; }
.trust-warn { color: #a40000; font-weight: 600; } .trust-note { color: #6b4e00; }
p.banner { margin: 0.4em 0; padding: 0.5em 0.8em; background: #fff4e0; border-left: 4px solid #c77700; }
header details { font-size: 0.9em; margin: 0.4em 0; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; display: block; max-width: 100%; overflow-x: auto; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
table.rungs { display: table; overflow: visible; }
table.rungs th, table.rungs td { padding: 0.25em 0.45em; }
tr.fastest td { font-weight: bold; }
td.verdict { border-radius: 3px; text-align: center; font-weight: 600; }
tr.gate-fail td.gate { color: #b00020; font-weight: bold; }
tr.not-run td { color: #555; font-style: italic; }
span.swatch { display: inline-block; width: 0.8em; height: 0.8em; vertical-align: middle; }
dl.kv { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1em; font-size: 0.92em; }
dl.kv dt { font-weight: 600; } dl.kv dd { margin: 0; font-family: ui-monospace, monospace; word-break: break-all; }
.missing { color: #6b4e00; background: #fcf8e3; padding: 0.5em 0.8em; border-left: 3px solid #e0c060; }
.chart svg { max-width: 100%; height: auto; }
ul.notes { font-size: 0.9em; } td.why { white-space: normal; min-width: 30em; }
td.w { white-space: normal; min-width: 6em; }
div.summary { border: 2px solid #1f6fb4; border-radius: 6px; padding: 0.6em 1em; background: #f5f9fd; }
div.summary pre { background: #fff; border: 1px solid #ddd; padding: 0.3em 0.6em; margin: 0.3em 0; overflow-x: auto; }
div.summary h3 { font-size: 1em; margin: 0.6em 0 0.2em; }
dl.said { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; margin: 0.4em 0; }
dl.said dt { font-weight: 600; } dl.said dd { margin: 0; }
div.summary p.why { margin: 0 0 0.4em; font-size: 0.9em; color: #444; }
"""

def esc(value: object) -> str:
    return html.escape("" if value is None else str(value))


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}">\n<h2>{esc(title)}</h2>\n{body}\n</section>'


def missing(why: str) -> str:
    """What a section says when the run holds nothing for it."""
    return f'<p class="missing">{esc(why)}</p>'


def notes(lines: Iterable[str]) -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f'<ul class="notes">{items}</ul>' if items else ""


def kv(pairs: Iterable[tuple[str, object]]) -> str:
    """Name: value pairs; a null value is shown as 'none' rather than left blank."""
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc('none' if v is None else v)}</dd>"
                                       for k, v in pairs) + "</dl>"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], left: Sequence[str] = (),
           row_classes: Sequence[str] | None = None,
           cell_attrs: Sequence[dict[int, tuple[str, str]]] | None = None, wrap: Sequence[str] = (),
           css: str = "", short: Sequence[str] = ()) -> str:
    """A plain table; `left` names the left-aligned (text) columns, the rest are numbers; `wrap` the
    columns of sentences, which may wrap (every other cell stays on one line); `short` the columns of a few words
    each, which may wrap between them to keep the table within the page; `css` the table's class.

    cell_attrs[i][j] = (class, style) of row i's cell j, for the verdict colours.
    """
    out = [f'<table class="{css}"><thead><tr>' if css else "<table><thead><tr>"]
    out.extend(("<th class=\"l\">" if h in left else "<th>") + f"{esc(h)}</th>" for h in headers)
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes else ""
        out.append(f'<tr class="{rc}">' if rc else "<tr>")
        for j, (h, v) in enumerate(zip(headers, row)):
            cls, style = cell_attrs[i].get(j, ("", "")) if cell_attrs else ("", "")
            classes = " ".join(c for c in ("l" if h in left else "", "why" if h in wrap else "",
                                           "w" if h in short else "", cls) if c)
            attrs = (f' class="{classes}"' if classes else "") + (f' style="{style}"' if style else "")
            out.append(f"<td{attrs}>{esc(v)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def luminance(colour: str) -> float:
    """WCAG's relative luminance of a #rrggbb colour."""
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two #rrggbb colours (1 to 21; text wants at least 4.5)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


INK, PAPER = "#111111", "#ffffff"


def chip_text(background: str) -> str:
    """The text colour that reads best on a chip's background: near-black or white, whichever contrasts more."""
    return max((INK, PAPER), key=lambda c: contrast(c, background))


def human_bytes(n: float | None) -> str:
    """Bytes in the unit that keeps 3 significant figures readable; 'n/a' for a value not measured."""
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


# -- charts ---------------------------------------------------------------------------------------

def svg(fig, prefix: str) -> str:
    """A matplotlib figure as an inline <svg> element (closes the figure)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with svg_settings():
        fig.savefig(buf, format="svg")
    plt.close(fig)
    return inline_svg(buf.getvalue(), prefix)


def svg_settings():
    """A fixed hash salt: the same results give byte-identical SVG, so build() stays a pure function."""
    import matplotlib

    return matplotlib.rc_context({"svg.hashsalt": "speedladder", "svg.fonttype": "path"})


def inline_svg(text: str, prefix: str) -> str:
    """An SVG document's text made fit to sit inline in HTML, its ids prefixed so figures never clash."""
    text = text[text.index("<svg"):]  # the XML prolog and DOCTYPE are not allowed inside HTML
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)  # creation date and tool: not needed here
    # Every figure defines the same glyph and clip ids; inline in one document they must be unique.
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', text)
    text = re.sub(r'(xlink:href|href)="#([^"]+)"', rf'\1="#{prefix}-\2"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", text)
    return f'<div class="chart" id="chart-{prefix}">{text}</div>'


def _figure(width: float, height: float, ncols: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    for ax in axes[0]:
        ax.spines[["top", "right"]].set_visible(False)
    return fig, list(axes[0])


def page(title: str, body: Iterable[str]) -> str:
    """The document around the sections: inline style only, nothing fetched."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    """A nested dict as dotted keys and printable values (a config, an environment)."""
    out: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.extend(flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", ",".join(map(str, v)) if isinstance(v, list) else v))
    return out
