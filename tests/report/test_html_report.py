"""report.html: self-contained, every section present (or saying why not), opened in a real browser offline."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from browser import find_browser, visit
from conftest import TINY

from speedladder.cli import main
from speedladder.records import Results, from_dict, storage
from speedladder.report import conclusion
from speedladder.report import html as html_report
from speedladder.report.common import label
from speedladder.report.mfu import device_peak

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "example-cpu-results.json"
SECTION_IDS = [sid for sid, _ in html_report.SECTIONS]
MAX_BYTES = 3 * 2**20  # "a few MB at most"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, one_thread) -> dict[str, Path]:
    """Three real run folders: a tiny `run`, the saved CPU example redrawn by `report`, a tiny `predict`."""
    base = tmp_path_factory.mktemp("html")
    assert main(["run", *TINY, "--rungs", "eager,bf16", "--out", str(base / "run")]) == 0
    example = base / "example"
    example.mkdir()
    shutil.copy(EXAMPLE, example / storage.FILENAME)
    assert main(["report", str(example)]) == 0
    assert main(["predict", "--preset", "tiny", "--device", "cpu", "--compose", "eager", "--window-steps", "2",
                 "--bandwidth", "1", "--nprocs", "2,4", "--quiet", "--out", str(base / "predict")]) == 0
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--seeds", "2",
                 "--calibrate-steps", "20", "--quiet", "--out", str(base / "race")]) == 0
    (run,) = (base / "run").iterdir()
    (predict,) = (base / "predict").iterdir()
    (race,) = (base / "race").iterdir()
    return {"run": run, "example": example, "predict": predict, "race": race, "tune": _tune_folder(base, race)}


def _tune_folder(base: Path, race: Path) -> Path:
    """The saved CPU example as a tune's folder: its rungs, and a race of finalists (the tiny race's section,
    renamed) that named the winner by time, with both judges' answers."""
    saved = json.loads(EXAMPLE.read_text())
    section = json.loads((race / storage.FILENAME).read_text())["race"]
    finalist = next(e for e in section["entries"] if e["name"] != "eager")
    finalist["name"] = "bf16"
    folder = base / "tune"
    folder.mkdir()
    winner = f"{folder}/winner.toml"
    saved["tune"] = {"budget_minutes": 10, "winner": "bf16", "winner_rungs": ["compile", "bf16"],
                     "winner_spec": finalist["spec"], "judge": "time", "judged_by": "the time to the target val loss",
                     "commands": {"run": f"speedladder run --config {winner}",
                                  "train": f"speedladder train --config {winner}",
                                  "apply": f'model, optimizer, autocast, spec = speedladder.apply(model, "{winner}")'},
                     "tokens_judge": {"judge": "tokens", "winner": "ckpt", "rungs": ["compile", "bf16", "batch", "ckpt"],
                                      "tokens_per_s_x": 2.9, "time_x": 0.8},
                     "time_judge": {"judge": "time", "winner": "bf16", "rungs": ["compile", "bf16"],
                                    "tokens_per_s_x": 1.46, "time_x": 1.69, "p_vs_eager": 0.0014, "p_vs_other": 0.002},
                     "race": section}
    (folder / storage.FILENAME).write_text(json.dumps(saved))
    assert main(["report", str(folder)]) == 0
    return folder


def section(page: str, sid: str) -> str:
    m = re.search(rf'<(section|header) id="{sid}">(.*?)</\1>', page, flags=re.DOTALL)
    assert m, f"no section {sid}"
    return m.group(2)


# Sections that must hold at least one chart, by folder; the others may say why they are empty.
CHARTS = {"run": ["waterfall", "loss-curves"], "example": ["waterfall", "loss-curves", "profile"],
          "predict": ["parallel"], "race": ["waterfall", "race"], "tune": ["waterfall", "race", "profile"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHARTS))
def test_every_section_is_there_and_nothing_is_fetched(folders, name):
    path = folders[name] / html_report.FILENAME
    page = path.read_text()
    assert 0 < path.stat().st_size < MAX_BYTES
    for sid in SECTION_IDS:
        body = section(page, sid)
        assert body.strip(), f"section {sid} is empty"
    for sid in CHARTS[name]:
        assert "<svg" in section(page, sid)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    # No attribute points anywhere but inside the page (SVG namespaces are names, not fetches).
    assert not re.findall(r'(?:src|href)="(?!#|data:)[^"]*"', page)
    assert len(re.findall(r'\bid="([^"]+)"', page)) == len(set(re.findall(r'\bid="([^"]+)"', page)))


@pytest.mark.slow
def test_empty_sections_say_why(folders):
    run = (folders["run"] / html_report.FILENAME).read_text()
    assert "--no-profile" in section(run, "profile") and 'class="missing"' in section(run, "profile")
    assert 'class="missing"' in section(run, "parallel")
    assert "n/a" in section(run, "memory") and "cpu" in section(run, "memory")
    predict = (folders["predict"] / html_report.FILENAME).read_text()
    for sid in ("rungs", "waterfall", "memory"):
        assert 'class="missing"' in section(predict, sid)


@pytest.mark.slow
def test_report_rewrites_it_from_the_saved_file_alone(folders, tmp_path, capsys):
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(folders["run"] / storage.FILENAME, moved / storage.FILENAME)
    assert main(["report", str(moved)]) == 0
    assert f"report: {moved / html_report.FILENAME}" in capsys.readouterr().out
    assert (moved / html_report.FILENAME).read_text() == (folders["run"] / html_report.FILENAME).read_text()


def test_build_is_a_pure_function_of_the_results():
    saved = json.loads(EXAMPLE.read_text())
    before = copy.deepcopy(saved)
    assert html_report.build(saved) == html_report.build(saved)
    assert saved == before


def test_the_header_and_rung_table_show_the_saved_values():
    saved = json.loads(EXAMPLE.read_text())
    page = html_report.build(saved)
    head = section(page, "header")
    assert saved["environment"]["git_commit"] in head and saved["environment"]["torch"] in head
    assert f"{saved['model']['params']:,} parameters" in head
    rungs = section(page, "rungs")
    for r in saved["rungs"]:
        assert f"{r['tokens_per_s']['median']:,.0f}" in rungs
    # The rung table: what a rung did to the speed, the gate and the speed's verdict apart, and why a rung is not
    # built upon; every other column of the wide table in the details below it, MFU named by its one peak.
    main, details = re.findall(r"<table[^>]*>.*?</table>", rungs, flags=re.DOTALL)[:2]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", main) == ["rung", "on", "tokens/s", "× prev", "× cum", "gate",
                                                         "verdict", "not built upon"]
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", details)
    assert device_peak(from_dict(Results, saved)) is None and "MFU" in headers  # a file from before any peak
    assert {"pred ×", "err", "step ms", "peak mem", "MFU at its precision", "TFLOP/s", "compile s",
            "min–max"} <= set(headers)
    assert "failed (" not in rungs and "✗" not in rungs
    # Every measured row's verdict cell is coloured as in the waterfall, its text picked to contrast with it.
    assert len(re.findall(r'class="[^"]*\bverdict\b[^"]*" style="background:#[0-9a-f]{6};color:#[0-9a-f]{6}"',
                          main)) == len(saved["rungs"])
    assert '<tr class="fastest">' in rungs


def test_memory_fields_and_learns_curves_are_drawn_when_present():
    saved = json.loads(EXAMPLE.read_text())
    for i, r in enumerate(saved["rungs"]):
        r["peak_memory_bytes"] = (i + 1) * 2**30
        r["saved_activation_bytes"] = (i + 1) * 3 * 2**20
    saved["learns_check"]["other"] = {"losses": [3.0, 2.5, 2.0]}  # a curve elsewhere under it is drawn too
    page = html_report.build(saved)
    mem = section(page, "memory")
    assert "saved_activation_bytes" in mem and "3.00 MiB" in mem and "2.00 GiB" in mem and "<svg" in mem
    labels = [label for label, _ in html_report.learns_curves(from_dict(Results, saved).learns_check)]
    assert labels == [saved["learns_check"]["rung"], "eager", "other"]


# What each kind's summary box must say: the winner, and the lines that use it (the example's, read from its file).
_EXAMPLE = json.loads(EXAMPLE.read_text())
_FASTEST = next(r for r in _EXAMPLE["rungs"] if r["name"] == _EXAMPLE["fastest"])
SUMMARY = {"run": (),
           "example": (_FASTEST["name"], f"{_FASTEST['speedup_cum']:.2f}×", "not raced",
                       "speedladder race --run RUN_DIR", 'speedladder.apply(model, "RUN_DIR")'),
           "race": ("× eager to the target", "speedladder.apply(model, \"RUN_DIR\")"),
           "tune": ("bf16", "1.69× (p win 0.0014 against eager)", "the tokens judge named ckpt",
                    "winner.toml")}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUMMARY))
def test_the_summary_names_the_winner_and_the_lines_that_use_it(folders, name):
    box = section((folders[name] / html_report.FILENAME).read_text(), "summary")
    for text in SUMMARY[name]:
        assert html_report.esc(text) in box, text
    assert 'class="summary"' in box
    if name == "run":  # the tiny run's bf16 may win or not, as this machine has it: a winner only where it won
        said = conclusion.of(storage.load(folders[name]))
        assert said is not None and html_report.esc(said.headline) in box
        assert ("<dt>winner</dt>" in box) == (not said.nothing_paid)
    predict = section((folders["predict"] / html_report.FILENAME).read_text(), "summary")
    assert 'class="missing"' in predict and "no winner to summarize" in predict


@pytest.mark.slow
@pytest.mark.parametrize("name", ["example", "race", "tune"])
def test_the_summary_box_is_seen_first_in_a_real_browser(folders, name, tmp_path):
    """In Chromium: the box is drawn, right under the header, above every other section; a screenshot of it."""
    shot = tmp_path / f"summary-{name}.png"

    def look(page) -> None:
        box = page.locator("#summary div.summary")
        assert box.count() == 1 and box.is_visible()
        top = box.bounding_box()
        assert top and top["width"] > 400 and top["height"] > 100
        assert page.locator("#header").bounding_box()["y"] < top["y"] < page.locator("#rungs").bounding_box()["y"]
        assert SUMMARY[name][0] in box.inner_text()
        box.screenshot(path=str(shot))

    requests, errors = visit(folders[name] / html_report.FILENAME, look)
    assert requests == [] and errors == []
    assert shot.stat().st_size > 5_000


def test_the_browser_check_sees_fetches_and_errors(tmp_path):
    """The check itself: a page that fetches an image and logs an error is caught doing both."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("boom")</script></body></html>')
    requests, errors = visit(bad)
    assert requests == ["http://127.0.0.1:9/x.png"]
    assert "boom" in errors


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHARTS))
def test_the_report_opens_offline_in_a_real_browser(folders, name, tmp_path):
    def look(page) -> None:
        for sid in SECTION_IDS:
            assert page.locator(f"#{sid}").count() == 1, sid
            box = page.locator(f"#{sid}").bounding_box()
            assert box and box["height"] > 0, sid
        for sid in CHARTS[name]:
            assert page.locator(f"#{sid} svg").count() >= 1, sid
        charts = page.locator("svg, img")
        assert charts.count() >= len(CHARTS[name])
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box and box["width"] > 50 and box["height"] > 50, f"chart {i} drawn at {box}"

    shot = tmp_path / f"{name}.png"
    requests, errors = visit(folders[name] / html_report.FILENAME, look, shot)
    assert requests == []
    assert errors == []
    assert shot.stat().st_size > 10_000


# -- the H200 pages of 2026-12-04, re-rendered, read at 900 and 1400 px ----------------------------------------

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
H200_PAGES = ("small", "gpt2", "cuda", "second-d2l", "second-gpt2")
WIDTHS = (900, 1400)
# What the page's own DOM says, read by the browser: each rung row's cells and its verdict cell's box and colours,
# the tables' overflow, the summary's groups, and where the trust line and the summary sit.
READ = """() => {
  const box = e => { const b = e.getBoundingClientRect(); return {x: b.left, y: b.top, r: b.right, b: b.bottom,
                                                                  w: b.width, h: b.height}; };
  const main = document.querySelector('#rungs table.rungs');
  const rows = [...main.querySelectorAll('tbody tr')].map(tr => {
    const td = [...tr.children]; const v = tr.querySelector('td.verdict'); const s = getComputedStyle(v);
    return {cells: td.map(c => c.innerText.trim()), verdict: box(v), color: s.color, background: s.backgroundColor,
            visible: v.checkVisibility()};
  });
  const said = [...document.querySelectorAll('#summary dl.said dt')].map(dt => [dt.innerText.trim(),
      [...dt.nextElementSibling.querySelectorAll('div')].map(d => d.innerText.trim())]);
  const q = s => document.querySelector(s);
  return {rows, said, headline: q('#summary p.headline') ? q('#summary p.headline').innerText : '',
          banner: q('#interrupted') ? q('#interrupted').innerText : null, trust: box(q('#trust')),
          trustText: q('#trust').innerText, summary: box(q('#summary')), table: box(main),
          overflow: main.scrollWidth - main.clientWidth, page: document.documentElement.scrollWidth};
}"""


def only(uri: str):
    """A route handler that lets the page itself load and aborts every other request."""
    def handle(route) -> None:
        route.continue_() if route.request.url == uri else route.abort()
    return handle


def _hex(css: str) -> str:
    r, g, b = (int(v) for v in re.findall(r"\d+", css)[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


@pytest.fixture(scope="module")
def h200_pages(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("h200")
    out = {}
    for name in H200_PAGES:
        out[name] = base / f"{name}.html"
        out[name].write_text(html_report.build(storage.load(H200 / f"{name}.json")), encoding="utf-8")
    return out


def test_the_h200_pages_read_as_their_tables_do_at_900_and_1400_px(h200_pages):
    """In Chromium, from the page's DOM: every row's verdict visible without scrolling at 900 and 1400 px (its box
    inside the viewport, the rung table not overflowing, the page not scrolling sideways), its chip's text at a
    contrast of 4.5:1 or more on its colour; the trust line first, then the summary; and the summary agreeing with
    the table above the fold: what paid won there, nothing under "did not pay" did, an interrupted run's banner."""
    from speedladder.report.htmlkit import contrast

    exe, sync_playwright = find_browser()
    seen: dict[tuple[str, int], dict] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe)
        try:
            for name, path in h200_pages.items():
                for width in WIDTHS:
                    page = browser.new_page(viewport={"width": width, "height": 900})
                    page.route("**/*", only(path.as_uri()))
                    page.goto(path.as_uri())
                    seen[name, width] = page.evaluate(READ)
                    page.close()
        finally:
            browser.close()
    for (name, width), d in seen.items():
        where = f"{name} at {width} px"
        saved = storage.load(H200 / f"{name}.json")
        assert d["page"] <= width and d["overflow"] <= 0, where  # nothing to scroll sideways
        assert len(d["rows"]) == len(saved.rungs), where
        for row, r in zip(d["rows"], saved.rungs):
            v = row["verdict"]
            assert row["visible"] and v["w"] > 0 and 0 <= v["x"] and v["r"] <= width, (where, row["cells"], v)
            assert row["cells"][0] == label(r) and row["cells"][6] == (r.verdict if r.ok else r.status
                                                                                 ).replace("pending", "interrupted")
            if r.ok:  # a coloured chip: its text readable on it
                assert contrast(_hex(row["color"]), _hex(row["background"])) >= 4.5, (where, row)
        assert d["trust"]["y"] < d["summary"]["y"] < d["table"]["y"], where
        assert "trust:" in d["trustText"] and "learns-check: not checked" in d["trustText"], where
        assert "machine not alone" not in d["trustText"] and "⚠ machine" not in d["trustText"]  # < 1 of 16 cores
        verdict = {row["cells"][0]: row["cells"][6] for row in d["rows"]}
        said = dict(d["said"])
        for line in said.get("paid", []):
            assert verdict[line.split(" ")[0]] == "win", (where, line)
        for line in said.get("did not pay", []):
            assert verdict[line.split(":")[0]] != "win" and ", win" not in line, (where, line)
        assert "it learns" not in d["headline"] and "nothing here to train" not in d["headline"], where
        assert (d["banner"] is not None) == (saved.status == "interrupted"), where
        if d["banner"] is not None:
            assert d["banner"].startswith("interrupted: stopped during ") and "Best so far: " in d["banner"], where
            assert d["trust"]["y"] < d["summary"]["y"], where
    cuda = dict(seen["cuda", 900]["said"])
    assert cuda["judged by the race"][0].startswith("muon: 0.29× cudagraphs in tokens/s")
    assert "⚠ drift: bf16, re-timed beside fp8, ran 27% above its own speed" in seen["cuda", 900]["trustText"]


def test_the_gates_scale_is_named_for_the_device_it_ran_on():
    """Eager at a lower precision is eager fp32 rounded as autocast rounds on that device (verify/emulate.py): on the
    H200, CUDA's policy; on a CPU, a CPU's. The saved scale ("eager bf16 (emulated)") is named so on the page."""
    from speedladder.report.common import scale_label

    saved = "eager bf16 (emulated) and bf16 (the rung it built on)"
    assert scale_label(saved, "cuda") == "eager at bf16 (autocast on CUDA, emulated) and bf16 (the rung it built on)"
    assert scale_label(saved, "cpu").startswith("eager at bf16 (autocast on a CPU, emulated)")
    assert scale_label("eager fp32 and eager (the rung it built on)", "cuda") == "eager fp32 and eager (the rung it " \
                                                                                "built on)"
    gates = section(html_report.build(storage.load(H200 / "small.json")), "gates")
    assert "eager at bf16 (autocast on CUDA, emulated)" in gates and "eager bf16 (emulated)" not in gates
