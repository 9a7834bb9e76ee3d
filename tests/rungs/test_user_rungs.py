"""A rung of the user's own (docs/rungs.md): declared with speedladder.rung, loaded with --rung-file, climbed,
gated as the built-in ones are, recorded with its file's hash, refused when the file changed; and bad rung files."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import Described, cli, only_folder

from speedladder import codec, rungs
from speedladder.config import settings
from speedladder.config.run import RunConfig
from speedladder.progress import Progress
from speedladder.rungs import RUNGS, Env, Requirement, RungError
from speedladder.rungs import files as rung_files
from speedladder.spec import StepSpec
from speedladder.step.workload import prepare
from speedladder.verify.gates import Gates

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "fused_mlp.py"  # the file docs/rungs.md shows, run as it is
FAST = ["--preset", "tiny", "--device", "cpu", "--window-steps", "3", "--loss-steps", "8", "--learns-steps", "0",
        "--no-profile", "--no-process-peak", "--quiet"]


@pytest.fixture
def forget():
    """Rungs a test loads are forgotten after it, with the files that declared them."""
    before = set(RUNGS)
    loaded = dict(rung_files._LOADED)
    yield
    for name in set(RUNGS) - before:
        rungs.unregister(name)
    rung_files._LOADED.clear()
    rung_files._LOADED.update(loaded)


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_the_documented_rung_file_is_climbed_gated_and_recorded_with_its_hash(tmp_path, forget):
    rc, _, err = cli("run", "--rung-file", str(EXAMPLE), "--rungs", "eager,fused-mlp", *FAST, "--out", str(tmp_path))
    assert rc == 0, err
    folder = only_folder(tmp_path)
    res = json.loads((folder / "results.json").read_text())
    fused = next(r for r in res["rungs"] if r["name"] == "fused-mlp")
    assert fused["status"] == "ok" and fused["gate"]["passed"], fused["gate"]["detail"]
    assert fused["source"] == str(EXAMPLE) and fused["kind"] == "speed"
    assert fused["gate"]["equivalence"]["rule"] == "fp64"  # the built-in gates, the same rule
    assert fused["spec"]["transforms"] == ["fused-mlp"]
    # config.toml keeps the file and the sha256 of its content; `run --config` re-runs the same rung.
    saved = codec.from_data(settings.Settings, settings.read(folder / settings.CONFIG_FILE))
    assert saved.run.rung_files == (str(EXAMPLE),)
    assert saved.run.rung_hashes == {str(EXAMPLE): rung_files.content_hash(str(EXAMPLE))}
    # speedladder.apply puts it on a model of the user's own, as it puts a built-in rung.
    import speedladder
    from speedladder.models.gpt import GPT

    work = prepare(RunConfig(preset="tiny", device="cpu"))
    model, _, _, spec = speedladder.apply(GPT(work.cfg.model), folder / settings.CONFIG_FILE)
    assert spec.transforms == ("fused-mlp",) and type(model.blocks[0].mlp).__name__ == "FusedMLP"


def test_a_saved_configuration_refuses_a_rung_file_changed_since(tmp_path, forget):
    mine = write(tmp_path, "mine.py", EXAMPLE.read_text())
    out = tmp_path / "runs"
    assert cli("run", "--rung-file", str(mine), "--rungs", "eager,fused-mlp", *FAST, "--out", str(out))[0] == 0
    config = only_folder(out) / settings.CONFIG_FILE
    mine.write_text(mine.read_text().replace("fewer kernels", "fewer kernels, changed"))
    rc, _, err = cli("run", "--config", str(config), "--out", str(tmp_path / "again"))
    assert rc == 2 and "has changed since this configuration was saved" in err and err.count("\n") == 1
    assert not (tmp_path / "again").exists()


PLANTED = '''
import math
import torch
import torch.nn.functional as F
from torch import nn

import speedladder
from speedladder.models.gpt import merge_heads, split_heads


class WrongGELU(nn.Module):
    """tanh-GELU with sqrt(2/pi) written as 2/pi: a plausible typo in a fused kernel."""
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(2 / math.pi * (x + 0.044715 * x ** 3)))


class NoMask(nn.Module):
    """Attention through SDPA that forgot is_causal: it sees the future."""
    def __init__(self, attn):
        super().__init__()
        self.n_head, self.qkv, self.proj = attn.n_head, attn.qkv, attn.proj

    def forward(self, x):
        q, k, v = split_heads(self.qkv(x), self.n_head)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v)))


@speedladder.rung("wrong-gelu", "GELU in one fused kernel (planted: a wrong constant)", kind="speed")
def wrong_gelu(model):
    for b in model.blocks:
        b.mlp.act = WrongGELU()
    return model


@speedladder.rung("no-mask", "fused attention (planted: the causal mask dropped)", kind="speed")
def no_mask(model):
    for b in model.blocks:
        b.attn = NoMask(b.attn)
    return model


@speedladder.rung("peek", "attention that sees every position (planted: an architecture that peeks)",
                  kind="architecture")
def peek(model):
    return no_mask(model)
'''


@pytest.fixture
def planted(tmp_path, forget):
    names = rung_files.load((str(write(tmp_path, "planted.py", PLANTED)),))
    assert names == ["wrong-gelu", "no-mask", "peek"]
    # The tiny GPT with GELU (tanh form), so that a wrong GELU is a wrong constant and nothing else.
    work = prepare(RunConfig(preset="tiny", device="cpu", model_changes={"activation": "gelu"}))
    gates = Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
    gate, bf16_probe = gates.check(work.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return work, gates, ref, {"eager": (work.base_spec, ref.probe), "bf16": (bf16, bf16_probe)}


@pytest.mark.parametrize("position", ["eager", "bf16"])
@pytest.mark.parametrize("name, caught_by", [("wrong-gelu", "differential"), ("no-mask", "causality")])
def test_a_wrong_speed_rung_from_a_user_file_is_caught_after_eager_and_after_bf16(planted, position, name,
                                                                                  caught_by):
    work, gates, ref, bases = planted
    spec, base = bases[position]
    gate, _ = gates.check(work.step(RUNGS[name].transform(spec, work.env)), ref, base, position, lambda m: None)
    assert not gate.passed and not getattr(gate, caught_by).passed, gate.detail


def test_an_architecture_rung_that_sees_the_future_fails_causality(planted):
    work, gates, _, _ = planted
    spec = RUNGS["peek"].transform(work.base_spec, work.env)
    assert gates.is_reference(spec)  # the function changed on purpose: it is its own reference, and probed
    gate, _ = gates.check(work.step(spec), None, None, None, lambda m: None)
    assert not gate.passed and not gate.causality.passed and "see the future" in gate.detail


@pytest.mark.parametrize("body, says", [
    ("raise ValueError('boom')\n", "raised at import: ValueError: boom"),
    ("import speedladder\nspeedladder.rung('one-call', 'the call form', spec={'compile': True})\n",
     "speedladder.rung(...) is the decorator; declare a rung in one call, with spec=, as speedladder.rung.define"),
    ("x = 1\n", "declares no rung"),
    ("import speedladder\nspeedladder.rung.define('compile', 'a second compile rung', spec={'compile': True})\n",
     "'compile' (" ),
    ("import speedladder\nspeedladder.rung.define('odd', 'a rung of no known kind', kind='fast', spec={})\n",
     "kind must be one of speed, memory, optimizer, architecture"),
])
def test_a_bad_rung_file_is_one_line_and_exit_2(tmp_path, forget, body, says):
    rc, _, err = cli("run", "--rung-file", str(write(tmp_path, "bad.py", body)), *FAST, "--out", str(tmp_path / "o"))
    assert rc == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_an_unknown_rung_name_lists_the_names_there_are(tmp_path, forget):
    rc, _, err = cli("run", "--rung-file", str(EXAMPLE), "--rungs", "eager,fused-mpl", *FAST,
                     "--out", str(tmp_path))
    assert rc == 2 and "unknown rung 'fused-mpl'" in err and "fused-mlp" in err and "compile" in err


@pytest.mark.parametrize("body, says", [
    ("""
     import speedladder

     @speedladder.rung("broken", "a transform that raises", kind="speed")
     def broken(model):
         raise RuntimeError("not today")
     """, "rung broken's model transform raised RuntimeError: not today"),
    ("""
     import torch
     import speedladder

     @speedladder.rung("grows", "a speed rung that adds a parameter it does not declare", kind="speed")
     def grows(model):
         model.extra = torch.nn.Linear(2, 2)
         return model
     """, "without declaring changes_params=True"),
])
def test_a_rung_that_fails_is_recorded_the_ladder_goes_on_and_the_command_exits_2(tmp_path, forget, body, says):
    file = write(tmp_path, "r.py", body)
    name = "broken" if "broken" in body else "grows"
    rc, _, err = cli("run", "--rung-file", str(file), "--rungs", f"eager,{name},bf16", *FAST,
                     "--out", str(tmp_path / "o"))
    assert rc == 2 and says in err and err.count("\n") == 1, err
    res = json.loads((only_folder(tmp_path / "o") / "results.json").read_text())
    status = {r["name"]: r["status"] for r in res["rungs"]}
    assert status == {"eager": "ok", name: "error", "bf16": "ok"}  # recorded, and the ladder went on
    assert res["status"] == "complete"


def test_the_api_declares_all_three_kinds_of_change_and_refuses_bad_declarations(forget):
    made = rungs.rung.define("twice-lr", "AdamW at twice the rate", "optimizer",
                      optimizer=lambda named, lr: torch.optim.AdamW(named.values(), lr=2 * lr))
    assert made.transform(StepSpec(2, 8), Env("cpu", None, 2)).optimizer == "twice-lr"
    on_spec = rungs.rung.define("compiled-again", "compile by the spec", spec={"compile": True})
    assert on_spec.transform(StepSpec(2, 8), Env("cpu", None, 2)).compile
    with pytest.raises(RungError, match="unknown step field 'compiled'"):
        rungs.rung.define("typo", "a field that is not there", spec={"compiled": True})
    with pytest.raises(RungError, match="without spaces"):
        rungs.rung.define("a,b", "a name with a comma", spec={})
    needs = Requirement(hooks=("speedladder_qk_norm",))
    assert "defines no speedladder_qk_norm() hook" in needs.unmet(Env("cpu", None, 2))
    assert needs.unmet(Env("cpu", None, 2, model=Described(hooks=("speedladder_qk_norm",)))) is None


RACE = ["race", "--preset", "tiny", "--device", "cpu", "--seeds", "2", "--calibrate-steps", "20",
        "--eval-every-base-steps", "10", "--time-cap", "30", "--quiet"]


def test_a_race_records_a_rung_that_raises_goes_on_and_exits_2_and_never_races_one_that_peeks(tmp_path, planted):
    broken = write(tmp_path, "broken.py", """
        import speedladder

        @speedladder.rung("broken", "a transform that raises", kind="speed")
        def broken(model):
            raise RuntimeError("not today")

        @speedladder.rung("bad-spec", "a spec transform that raises", kind="speed", on="spec")
        def bad_spec(spec, env):
            raise RuntimeError("no spec today")
        """)
    planted_file = next(f for f in rung_files._LOADED)
    rc, _, err = cli(*RACE, "--rung-file", str(broken), "--rung-file", planted_file,
                     "--rungs", "eager,broken,bad-spec,peek,bf16", "--out", str(tmp_path / "o"))
    assert rc == 2 and "rung broken" in err and "not today" in err and err.count("\n") == 1, err
    race = json.loads((only_folder(tmp_path / "o") / "results.json").read_text())["race"]
    entries = {e["name"]: e for e in race["entries"]}
    assert entries["broken"]["status"] == "error" and entries["bad-spec"]["status"] == "error"
    assert "no spec today" in entries["bad-spec"]["detail"]
    # An architecture that sees the future would reach any loss sooner: it fails causality and never trains.
    assert entries["peek"]["status"] == "failed" and "see the future" in entries["peek"]["detail"]
    assert entries["peek"]["runs"] == [] and not entries["peek"]["built_upon"]
    assert entries["bf16"]["status"] == "ok" and entries["bf16"]["built_on"] == "eager"  # the race went on


def test_the_documented_rung_file_is_raced(tmp_path, forget):
    rc, _, err = cli(*RACE, "--rung-file", str(EXAMPLE), "--rungs", "eager,fused-mlp", "--out", str(tmp_path))
    assert rc == 0, err
    race = json.loads((only_folder(tmp_path) / "results.json").read_text())["race"]
    fused = next(e for e in race["entries"] if e["name"] == "fused-mlp")
    assert fused["status"] == "ok" and fused["causality"]["passed"] and fused["built_on"] == "eager"
    assert len(fused["runs"]) == 2 and fused["verdict"] in ("win", "noise", "loss", "did not reach")
    assert not fused["changes_learning"]  # a speed rung: the same function, judged by time alone


def test_the_indexes_are_read_from_rungs_so_unregister_forgets_a_rung_everywhere():
    """MODEL_TRANSFORMS, TRANSFORM_KINDS, NEW_PARAMS and OPTIMIZERS are computed from RUNGS: one registry to keep."""
    indexes = (rungs.MODEL_TRANSFORMS, rungs.TRANSFORM_KINDS, rungs.NEW_PARAMS, rungs.OPTIMIZERS)
    made = rungs.rung.define("grown", "a planted architecture with its own optimizer", "architecture",
                             model=lambda model: model, optimizer=lambda params, lr: torch.optim.SGD(params.values(), lr))
    try:
        assert isinstance(made, rungs.Rung) and rungs.TRANSFORM_KINDS["grown"] == "architecture"
        assert all("grown" in index for index in indexes)
    finally:
        rungs.unregister("grown")
    assert not any("grown" in index for index in indexes)


def test_the_decorator_returns_the_function_and_define_the_rung():
    @rungs.rung("decorated", "a planted model transform")
    def decorated(model):
        return model

    try:
        assert callable(decorated) and not isinstance(decorated, rungs.Rung)
        assert rungs.RUNGS["decorated"].model is decorated and "decorated" in rungs.MODEL_TRANSFORMS
        with pytest.raises(RungError, match="on must be"):
            rungs.rung("elsewhere", "a part that is not there", on="loss")
    finally:
        rungs.unregister("decorated")
