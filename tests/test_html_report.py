"""report.html: self-contained, every section present (or saying why not), opened in a real browser offline."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import TINY

from speedladder import results
from speedladder.cli import main
from speedladder.records import Results, from_dict
from speedladder.report import html as html_report

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "example-cpu-results.json"
SECTION_IDS = [sid for sid, _ in html_report.SECTIONS]
MAX_BYTES = 3 * 2**20  # "a few MB at most"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, one_thread) -> dict[str, Path]:
    """Three real run folders: a tiny `run`, the saved CPU example redrawn by `report`, a tiny `predict`."""
    base = tmp_path_factory.mktemp("html")
    assert main(["run", *TINY, "--rungs", "eager,bf16", "--out", str(base / "run")]) == 0
    example = base / "example"
    example.mkdir()
    shutil.copy(EXAMPLE, example / results.FILENAME)
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
    section = json.loads((race / results.FILENAME).read_text())["race"]
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
    (folder / results.FILENAME).write_text(json.dumps(saved))
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
    shutil.copy(folders["run"] / results.FILENAME, moved / results.FILENAME)
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
    # Every column of the wide table, the gate and the speed's verdict apart, and why a rung is not built upon.
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", rungs)
    assert headers[:3] == ["rung", "on", "tokens/s"] and headers[-3:] == ["gate", "verdict", "not built upon"]
    assert {"pred ×", "err", "step ms", "peak mem", "MFU", "TFLOP/s", "compile s", "min–max"} <= set(headers)
    assert "failed (" not in rungs and "✗" not in rungs
    # Every measured row's verdict cell is coloured as in the waterfall.
    assert len(re.findall(r'class="[^"]*\bverdict\b[^"]*" style="background:#', rungs)) == len(saved["rungs"])
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


def _browser():
    """Chromium and playwright, or a skip (a failure under CI=true, so CI cannot skip it silently)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [name for name, ok in (("chromium", exe), ("playwright", sync_playwright)) if not ok]
    if missing:
        why = f"{' and '.join(missing)} not installed (apt-get install chromium; pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the browser test cannot run: {why}")
        pytest.skip(why)
    return exe, sync_playwright


def visit(path: Path, look=lambda page: None, shot: Path | None = None) -> tuple[list[str], list[str]]:
    """Open a file in headless Chromium with every other request aborted; the requests tried and the errors."""
    exe, sync_playwright = _browser()
    path = path.resolve()
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def block(route):  # the page itself is the only thing it may load
                if route.request.url == path.as_uri():
                    route.continue_()
                else:
                    requests.append(route.request.url)
                    route.abort()

            page.route("**/*", block)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            look(page)
            if shot is not None:
                page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return requests, errors


# What each kind's summary box must say: the winner, and the lines that use it (the example's, read from its file).
_EXAMPLE = json.loads(EXAMPLE.read_text())
_FASTEST = next(r for r in _EXAMPLE["rungs"] if r["name"] == _EXAMPLE["fastest"])
SUMMARY = {"run": ("speedladder train --run RUN_DIR", "not raced"),
           "example": (_FASTEST["name"], f"{_FASTEST['speedup_cum']:.2f}×", "not raced: speedladder race --run RUN_DIR"),
           "race": ("× eager to the target", "speedladder.apply(model, \"RUN_DIR\")"),
           "tune": ("bf16", "1.69× (p win 0.0014 against eager)", "the tokens judge named ckpt",
                    "winner.toml")}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUMMARY))
def test_the_summary_names_the_winner_and_the_lines_that_use_it(folders, name):
    box = section((folders[name] / html_report.FILENAME).read_text(), "summary")
    for text in SUMMARY[name]:
        assert html_report.esc(text) in box, text
    if name != "run":  # the tiny run's fastest may be eager or bf16, as this machine has it
        assert 'class="summary"' in box
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
