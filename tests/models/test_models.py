"""Your model: three user model files climb the default ladder; conventions, hooks, FLOPs and dropout (docs/models.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
import torch
from conftest import cli
from usermodels import write_models

from speedladder import codec, models
from speedladder.cli import main
from speedladder.config.resolved import resolve
from speedladder.config.run import RunConfig
from speedladder.config.settings import Settings
from speedladder.errors import UsageError
from speedladder.models.build import ours
from speedladder.models.definition import CONVENTIONS, count_flops
from speedladder.models.model_record import ModelRecord
from speedladder.models.presets import PRESETS
from speedladder.profile.categories import IDLE
from speedladder.profile.predict import NO_MODEL, chain
from speedladder.records import CategoryTime, ProfileSummary, storage
from speedladder.rungs import RUNGS, Capability
from speedladder.step.workload import define_model, prepare
from speedladder.train.trainer import load_checkpoint
from speedladder.tune import search

# Tiny and quick: two steps a window, gates over 4 batches, a 60-step learns-check, no resident-peak child per rung;
# MFU against a stated peak.
# lr 3e-3: at 1e-3 the small user models end 60 learns-check steps within 0.001 of the unigram entropy (2.848
# against 2.847), either side; at 3e-3 they end at 2.641.
FAST = ["--preset", "tiny", "--device", "cpu", "--lr", "0.003", "--window-steps", "2", "--loss-steps", "4",
        "--learns-steps", "60", "--no-profile", "--no-process-peak", "--peak-tflops", "fp32=1,bf16=1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_models(tmp_path_factory.mktemp("usermodels"))


def climb(model: str, out: Path, *extra: str) -> dict:
    rc, stdout, stderr = cli("run", *FAST, "--model", model, "--out", str(out), *extra)
    assert rc == 0, stderr[-2000:]
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return {"res": json.loads((folder / "results.json").read_text()), "out": stdout, "folder": folder}


# -- the default ladder on each of three user models ----------------------------------------------------

# Each climbs the default ladder less the batch rung and its fp32 control (the same model at another shape: on
# nanoGPT's, where compile wins and every rung above compiles again, two cold compiles of about 30 s each). The
# batch rung on a user model is climbed below (loss_only.py), and the whole default ladder by our GPT
# (tests/ladder/test_ladder.py).
SHORT = ["--rungs", "eager,compile,bf16,ckpt"]


@pytest.fixture(scope="module", params=["nano.py:GPT", "logits_only.py:make_lm", "noisy.py:Noisy"])
def climbed(request, model_dir, tmp_path_factory) -> dict:
    """The default ladder (compile included, batch left out) on one user model file: one run that the tests below
    read."""
    return {**climb(str(model_dir / request.param), tmp_path_factory.mktemp("climb"), *SHORT), "spec": request.param}


@pytest.mark.slow
def test_each_user_model_climbs_the_default_ladder_with_gates_and_counted_mfu(climbed):
    res = climbed["res"]
    assert res["status"] == "complete"
    default = ["eager", "compile", "bf16", "batch", "batch-fp32", "ckpt"]
    assert [r["name"] for r in res["rungs"]] == [n for n in default if not n.startswith("batch")]
    for r in res["rungs"]:
        assert r["status"] == "ok", r["detail"]
        assert r["gate"]["passed"], (r["name"], r["gate"]["detail"])
        assert r["flops_per_token"] > 0 and r["mfu"] == pytest.approx(r["tflops"] / 1.0)
    assert res["model"]["flops_method"] == "counted" and res["model"]["matmul_params"] is None
    assert res["model"]["blocks"] == "blocks" and res["model"]["kind"] == "user"
    assert res["fastest"] is not None and res["learns_check"]["passed"]
    assert (climbed["folder"] / "waterfall.png").exists() and (climbed["folder"] / "report.html").exists()
    assert res["config"]["model_source"].endswith(climbed["spec"]) and res["config"]["model"] is None
    assert f"model: {res['model']['name']}: {res['model']['convention_means']}; FLOPs per token counted by torch; " \
           f"dropout {res['model']['dropout']}." in " ".join(climbed["out"].split())  # said in the notes


@pytest.mark.slow
def test_the_convention_and_dropout_are_detected_and_recorded(climbed):
    model = climbed["res"]["model"]
    expected = {"nano.py:GPT": ("logits_loss", "off: dropout=0.0 given"),
                "logits_only.py:make_lm": ("logits", "none"),
                "noisy.py:Noisy": ("logits", "off: 2 dropout module(s)")}[climbed["spec"]]
    assert model["convention"] == expected[0] and model["dropout"].startswith(expected[1])
    assert model["source"]["arguments"] == {"nano.py:GPT": {"vocab_size": 28, "block_size": 32, "dropout": 0.0},
                                            "logits_only.py:make_lm": {"vocab_size": 28},
                                            "noisy.py:Noisy": {"vocab_size": 28}}[climbed["spec"]]
    eq = next(r for r in climbed["res"]["rungs"] if r["name"] == "compile")["gate"]["equivalence"]
    assert eq["logits_max_abs_err"] is not None and eq["grad_rel_err"] < 1e-3


@pytest.mark.slow
def test_a_loss_only_model_is_gated_on_its_loss_and_gradients(model_dir, tmp_path):
    res = climb(str(model_dir / "loss_only.py:LossOnly"), tmp_path, "--rungs", "eager,bf16,batch,ckpt")["res"]
    assert res["model"]["convention"] == "loss"
    for r in res["rungs"][1:]:
        assert r["status"] == "ok" and r["gate"]["passed"], (r["name"], r["detail"], r["gate"]["detail"])
        eq = r["gate"]["equivalence"]
        if eq:  # the control is eager fp32 itself at its batch
            assert eq["logits_max_abs_err"] is None and "loss only" in eq["logits"] and eq["grad_rel_err"] >= 0


@pytest.mark.slow
def test_the_rungs_skipped_on_a_user_model_say_why(model_dir, tmp_path):
    """sdpa and pad-vocab apply to our GPT, Hugging Face's, or a model with hooks; elsewhere they are skipped."""
    res = climb(str(model_dir / "nano.py:GPT"), tmp_path, "--rungs", "eager,sdpa,pad-vocab,muon")["res"]
    rungs = {r["name"]: r for r in res["rungs"]}
    for name in ("sdpa", "pad-vocab"):
        assert rungs[name]["status"] == "skipped" and "not applicable to this model" in rungs[name]["detail"]
        assert rungs[name]["requirement"]["model"] == name
    assert rungs["muon"]["status"] == "ok" and rungs["muon"]["gate"]["passed"]  # hidden matrices: blocks.*


@pytest.mark.slow
def test_hooks_let_a_user_model_take_sdpa_and_pad_vocab(model_dir, tmp_path):
    res = climb(str(model_dir / "hooked.py:make_hooked"), tmp_path, "--rungs", "eager,sdpa,pad-vocab")["res"]
    rungs = {r["name"]: r for r in res["rungs"]}
    assert res["model"]["not_applicable"] == {}
    for name in ("sdpa", "pad-vocab"):
        assert rungs[name]["status"] == "ok" and rungs[name]["gate"]["passed"], rungs[name]["detail"]
    # pad-vocab grew the head to 64 rows; the loss reads the 28 real ones, so it equals eager's at the same weights.
    eq = rungs["pad-vocab"]["gate"]["equivalence"]
    assert eq["loss"] == pytest.approx(eq["loss_ref"], rel=1e-5)


@pytest.mark.slow
def test_a_model_without_repeated_blocks_skips_ckpt_with_the_reason(model_dir, tmp_path):
    res = climb(str(model_dir / "flat.py:Bigram"), tmp_path, "--rungs", "eager,ckpt")["res"]
    ckpt = res["rungs"][1]
    assert ckpt["status"] == "skipped" and "no repeated blocks" in ckpt["detail"] and res["model"]["blocks"] is None


def test_an_unknown_convention_is_one_line_naming_the_accepted_ones(model_dir, tmp_path, capsys):
    assert main(["run", *FAST, "--model", str(model_dir / "odd.py:Odd"), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot tell how to call" in err and "returned a dict" in err
    for convention in CONVENTIONS.values():
        assert convention in err
    assert not (tmp_path / "runs").exists()  # refused before any run folder


@pytest.mark.parametrize("spec, message", [
    ("missing.py:GPT", "model file not found"),
    ("nano.py:Nope", "has no 'Nope'"),
    ("nano.py", "FILE.py:NAME"),
    ("no.such.module:GPT", "cannot import no.such.module"),
])
def test_bad_model_specs_are_one_line(spec, message, model_dir, capsys):
    where = spec if spec.startswith("no.such") else str(model_dir / spec)
    assert main(["run", *FAST, "--model", where]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


BROKEN = '''
import torch
from torch import nn


class NoParams(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, x):
        return torch.nn.functional.one_hot(x, self.vocab_size).float()


class Raises(nn.Module):
    """Its forward works while speedladder detects the convention, then raises, as a user's bug would."""

    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 3:
            raise ValueError("the forward broke")
        return self.emb(x) @ self.emb.weight.T
'''


def test_a_baseline_that_cannot_run_fails_the_run_in_one_line_and_says_why(tmp_path, capsys):
    (tmp_path / "broken.py").write_text(BROKEN)
    assert main(["run", *FAST, "--model", f"{tmp_path}/broken.py:NoParams", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no trainable parameters" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists()  # refused before any folder
    assert main(["run", *FAST, "--rungs", "eager,bf16", "--model", f"{tmp_path}/broken.py:Raises", "--quiet",
                 "--out", str(tmp_path / "b")]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == "speedladder: error: the baseline eager did not run: error: ValueError: the forward broke"
    saved = storage.load(next((tmp_path / "b").iterdir()))  # what was measured is kept, and says why
    assert saved.status == "failed" and saved.error == err.strip().removeprefix("speedladder: error: ")
    assert saved.rungs[0].status == "error" and "run failed: the baseline eager did not run" in out


# -- the parts, one by one -------------------------------------------------------------------------------

def test_counted_flops_agree_with_the_formula_on_our_gpt():
    for preset in ("tiny", "d2l-cpu"):
        cfg = PRESETS[preset].model
        d = ours(cfg)
        assert d.flops_method == "formula"
        formula, counted = d.flops_per_token(cfg.block_size), count_flops(d, cfg.block_size)
        assert counted == pytest.approx(formula, rel=0.05)
        assert counted != formula  # two ways of counting, not one number twice (biases and norms differ)


def test_the_same_weights_give_the_same_loss_in_every_convention(model_dir):
    """The loss is next-token cross-entropy over every position, whoever computes it: comparable across models."""
    losses = []
    for spec in ("nano.py:GPT", "logits_only.py:make_lm", "noisy.py:Noisy", "loss_only.py:LossOnly"):
        work = prepare(RunConfig(preset="tiny", device="cpu", model_source=str(model_dir / spec)))
        step = work.step(work.base_spec)
        x, y = work.gate_batches(work.base_spec, 1)[0]
        losses.append(float(step.forward_backward(x, y)[1].detach()))
    assert losses == pytest.approx([losses[0]] * 4, rel=1e-6)


def test_dropout_outside_dropout_modules_puts_the_whole_model_in_eval_mode(model_dir):
    class SDPADropout(torch.nn.Module):  # nanoGPT's flash path: dropout_p while self.training
        def __init__(self, vocab_size):
            super().__init__()
            self.wte = torch.nn.Embedding(vocab_size, 8)
            self.head = torch.nn.Linear(8, vocab_size)

        def forward(self, idx):
            q = self.wte(idx)[:, None]
            y = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5 if self.training else 0.0)
            return self.head(y[:, 0])

    work = prepare(RunConfig(preset="tiny", device="cpu"), SDPADropout)
    assert work.model.whole_eval and "whole model in eval mode" in work.model.dropout
    assert not work.step(work.base_spec).model.training

    class Noise(SDPADropout):
        def forward(self, idx):
            return super().forward(idx) + torch.randn(())

    with pytest.raises(UsageError, match="different on every forward"):
        prepare(RunConfig(preset="tiny", device="cpu"), Noise)


def test_rungs_that_need_what_a_model_lacks_are_unmet():
    work = prepare(RunConfig(preset="tiny", device="cpu"), lambda vocab_size: torch.nn.Sequential(
        torch.nn.Embedding(vocab_size, 8), torch.nn.Linear(8, vocab_size)))
    assert work.model.convention == "logits" and work.model.blocks is None
    for name in ("ckpt", "sdpa", "pad-vocab", "muon"):
        assert "not applicable to this model" in RUNGS[name].requires.unmet(work.env)
    for name in ("compile", "bf16", "batch", "fused-adamw"):
        assert RUNGS[name].requires.unmet(work.env) is None


def test_an_unknown_architecture_gets_no_invented_prediction():
    names = ("matmul", "attention", "elementwise & norm", "reductions & softmax", "copies & H2D", "optimizer", IDLE,
             "other")
    profile = ProfileSummary(categories={n: CategoryTime(ms=1.0) for n in names},
                             params=1000, copy_gbps=10.0, model=None)
    work = prepare(RunConfig(preset="tiny", device="cpu"))
    preds = {p.rung: p for p in chain(profile, ["compile", "bf16", "batch", "ckpt", "sdpa", "fused-adamw"],
                                      work.base_spec, work.env)}
    for name in ("bf16", "batch", "sdpa"):
        assert preds[name].speedup is None and preds[name].reason == NO_MODEL
    for name in ("compile", "ckpt", "fused-adamw"):
        assert preds[name].speedup is not None


# -- the other commands on a user model ----------------------------------------------------------------

def test_train_saves_a_checkpoint_that_loads_into_the_users_model(model_dir, tmp_path):
    rc, out, err = cli("train", "--preset", "tiny", "--device", "cpu", "--model", str(model_dir / "nano.py:GPT"),
                       "--compose", "eager,bf16,ckpt", "--steps", "20", "--log-every", "10", "--sample-tokens", "8",
                       "--out", str(tmp_path))
    assert rc == 0, err
    assert "forward(x, y) -> (logits, loss)" in out and "sample (8 tokens" in out
    (path,) = tmp_path.glob("*/checkpoint.pt")
    ckpt = torch.load(path, weights_only=True)
    spec = importlib.util.spec_from_file_location("users_own_nano", model_dir / "nano.py")
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    model = theirs.GPT(vocab_size=28, block_size=32)  # the user's own class, built by the user
    model.load_state_dict(ckpt["model"])  # strict: the reference names, no checkpoint wrappers
    assert torch.equal(model.lm_head.weight, ckpt["model"]["lm_head.weight"])
    again, _ = load_checkpoint(path)
    assert type(again).__name__ == "GPT" and torch.equal(again.wte.weight, model.wte.weight)


@pytest.mark.slow
def test_tune_takes_a_user_model_and_its_commands_name_it(model_dir, tmp_path):
    spec = str(model_dir / "logits_only.py:make_lm")
    rc, _, err = cli("tune", "--preset", "tiny", "--device", "cpu", "--model", spec, "--window-steps", "2",
                     "--budget-minutes", "0.01", "--out", str(tmp_path), "--quiet")
    assert rc == 0, err
    saved = storage.load(next(tmp_path.iterdir()))
    assert saved.model.kind == "user" and saved.config.run.model_source == spec
    skipped = {r.name: r.detail for r in saved.rungs if r.status == "skipped"}
    assert len(skipped) == len(saved.rungs)  # 0.6 s: the profile alone spends the budget
    assert "tune budget" in skipped["eager"] and "not applicable to this model" in skipped["sdpa"]
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=spec))
    won = search.winner_settings(Settings(), work.cfg.run, ("compile",))
    assert won.run.model_source == spec and won.train.rungs == ("compile",)  # winner.toml names the model


@pytest.mark.slow
def test_profile_and_predict_take_a_user_model(model_dir, tmp_path):
    spec = str(model_dir / "nano.py:GPT")
    rc, _, err = cli("profile", "--preset", "tiny", "--device", "cpu", "--model", spec, "--profile-steps", "2",
                       "--out", str(tmp_path / "p"))
    assert rc == 0, err
    prof = json.loads(next((tmp_path / "p").glob("*/profile.json")).read_text())
    assert prof["profile"]["model"] is None and prof["profile"]["matmuls"] == {}
    preds = {p["rung"]: p for p in prof["predictions"]}
    assert preds["bf16"]["speedup"] is None and preds["bf16"]["reason"] == NO_MODEL
    assert preds["compile"]["speedup"] > 0
    rc, _, err = cli("predict", "--preset", "tiny", "--device", "cpu", "--model", spec, "--compose", "eager",
                       "--window-steps", "2", "--nprocs", "2", "--bandwidth", "10", "--out", str(tmp_path / "q"))
    assert rc == 0, err
    saved = json.loads(next((tmp_path / "q").glob("*/results.json")).read_text())
    section = saved["parallel"]
    assert section["grad_bytes"] == 4 * saved["model"]["params"] and len(section["unit_bytes"]) == 3  # root, 2 blocks


@pytest.mark.slow
def test_ddp_shards_a_user_model_by_its_blocks(model_dir, tmp_path):
    rc, _, err = cli("ddp", "--preset", "tiny", "--device", "cpu", "--model", str(model_dir / "nano.py:GPT"),
                     "--compose", "eager", "--nproc", "2", "--window-steps", "2", "--strategy", "fsdp",
                     "--master-port", "29631", "--quiet", "--out", str(tmp_path))
    assert rc == 0, err
    saved = json.loads(next(tmp_path.glob("*/results.json")).read_text())
    section = saved["parallel"]
    assert len(section["unit_bytes"]) == 3  # one FSDP unit per block of the user's nn.ModuleList, and the root
    assert section["measured"]["param_check"]["identical"]


def _models_path(call: Callable[[], object]) -> tuple[list[str], set[tuple[str, str]]]:
    """The files of models/ a call enters, in the order first entered, and every (caller, callee) pair of files.

    A call's caller is the nearest frame below it in models/ (torch's nn.Module.__call__ between detect and a
    forward defined in base is detect calling base), else "outside"."""
    where = Path(models.__file__).parent

    def file_of(frame: FrameType | None) -> str | None:
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if path.parent == where:
                return path.stem
            frame = frame.f_back
        return None

    order: list[str] = []
    edges: set[tuple[str, str]] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or Path(frame.f_code.co_filename).parent != where:
            return
        callee = Path(frame.f_code.co_filename).stem
        caller = file_of(frame.f_back) or "outside"
        if caller != callee:
            edges.add((caller, callee))
            if callee not in order:
                order.append(callee)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return order, edges


def test_a_model_file_enters_each_file_of_models_once_in_one_direction(model_dir):
    """--model FILE.py:NAME goes build -> user -> detect -> definition: each file entered from one file only, and no
    call goes back up to a file entered before (no zigzag between the family, the detection and the record)."""
    cfg = resolve(RunConfig(preset="tiny", device="cpu", model_source=str(model_dir / "nano.py:GPT")), torch.device("cpu"))
    order, edges = _models_path(lambda: define_model(cfg, 65))
    assert order == ["build", "user", "detect", "definition", "float8", "capability"], order
    assert all(order.index(a) < order.index(b) for a, b in edges if a != "outside"), sorted(edges)
    callers = {callee: {a for a, b in edges if b == callee} for callee in order}
    assert callers == {"build": {"outside"}, "user": {"build"}, "detect": {"build"}, "definition": {"detect"},
                       "float8": {"user"}, "capability": {"float8"}}


def test_a_model_def_is_frozen_and_its_record_is_typed():
    """One ModelDef, built in models/build.py, changes no more; its record is a ModelRecord that results.json
    writes as before and reads back."""
    d = ours(PRESETS["tiny"].model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.blocks = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.transforms[Capability.SDPA] = lambda m: m  # type: ignore[index]
    saved = codec.to_data(d.record())
    assert set(saved) == {"kind", "name", "source", "convention", "convention_means", "vocab_size", "flops_method",
                          "blocks", "dropout", "not_applicable"}
    assert ModelRecord.from_dict({**saved, "params": 1}) == d.record()
