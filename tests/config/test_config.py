"""One typed source of configuration: the flags generated from the dataclasses, config files read and written
through one codec, runs reproduced from their config.toml, check re-running the right model, and the winner
applied in a user's own loop (speedladder.apply) matching speedladder's own step."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import only_folder
from usermodels import write_models

from speedladder import codec
from speedladder.cli import ALL, build_parser, main
from speedladder.cli.gen import DEST, leaves, shown_default, to_settings
from speedladder.config import settings
from speedladder.config.run import RunConfig, TimingConfig
from speedladder.config.settings import Settings
from speedladder.errors import UsageError
from speedladder.models import user as user_models
from speedladder.models.gpt import GPT
from speedladder.rungs import RUNGS, Env, compose
from speedladder.spec import StepSpec
from speedladder.step.workload import prepare
from speedladder.tune import search

QUICK = ["--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--window-steps", "2", "--loss-steps", "2",
         "--learns-steps", "0", "--no-profile", "--no-process-peak", "--quiet"]


def _parsers():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices


def test_every_flags_help_says_the_dataclass_default_and_no_flag_changes_a_default():
    fields = {path: f for path, f, _ in leaves()}
    seen = 0
    for name, p in _parsers().items():
        for action in p._actions:
            if not action.dest.startswith(DEST):
                continue
            f = fields[action.dest[len(DEST):]]
            if action.nargs != 0:  # a flag that takes a value says its default, as the field holds it
                said = re.search(r"Default: (.*)$", action.help.replace("%%", "%")).group(1)
                assert said == shown_default(f), (name, action.option_strings)
                if not f.metadata.get("shown"):
                    value = codec.default_of(f)
                    assert said == (",".join(map(str, value)) if isinstance(value, tuple) else str(value))
                seen += 1
        # Nothing given: every value is the dataclass's (argparse's own defaults never reach the Settings).
        assert to_settings(build_parser().parse_args([name] + (["x", "y"] if name == "compare" else
                                                              ["x"] if name in ("report", "judge") else
                                                              ["x", "y"] if name == "gates" else []))) == Settings()
    assert seen > 150
    assert shown_default(dataclasses.fields(TimingConfig)[1]) == "5"


def test_flag_spellings_users_have_keep_working():
    flags = {o for p in _parsers().values() for a in p._actions for o in a.option_strings}
    for old in ("--model", "--hf", "--hf-set", "--vocab-size", "--no-profile", "--no-process-peak", "--explain-miss",
                "--profile-steps", "--profile-rungs", "--peak-tflops", "--loss-steps", "--loss-band",
                "--learns-steps", "--learns-band", "--target-steps", "--budget-minutes", "--max-candidates",
                "--batch-multiplier", "--rdzv-backend", "--master-port", "--nproc", "--bandwidth",
                "--measure-bandwidth", "--latency-us", "--bucket-cap-mb", "--strategy", "--widths", "--layers",
                "--seq-lens", "--batch-sizes", "--tolerance", "--against", "--baseline", "--html", "--run",
                "--log-every", "--sample-tokens", "--eval-every", "--time-cap", "--combos", "--config"):
        assert old in flags, old
    assert {c.name for c in ALL} == {"run", "profile", "tune", "race", "train", "report", "predict", "ddp",
                                    "compare", "check", "gates", "sweep", "judge"}


def test_flags_override_the_config_file_which_overrides_the_defaults(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('quiet = true\n[run]\npreset = "tiny"\nseed = 5\nrungs = ["eager", "bf16"]\n'
                    '[run.timing]\nwindows = 7\n[run.gates]\nlearns_steps = 0\n')
    s = to_settings(build_parser().parse_args(["run", "--config", str(path), "--seed", "9", "--window-steps", "3"]))
    assert (s.run.preset, s.run.seed, s.run.rungs, s.quiet) == ("tiny", 9, ("eager", "bf16"), True)
    assert (s.run.timing.windows, s.run.timing.steps, s.run.gates.learns_steps) == (7, 3, 0)
    assert s.run.gates.loss_steps == 20 and s.run.lr == 1e-3  # neither file nor flag: the dataclass's


@pytest.mark.parametrize("text, message", [
    ("[run]\nbatchsize = 3\n", "unknown key 'run.batchsize'"),
    ("[run]\nbatch_size = 'x'\n", "run.batch_size: expected a whole number, got 'x'"),
    ("[run]\nbatch_size = 0\n", "batch size must be positive, got 0"),
    ("[run.timing]\nwindows = 2\n", "at least 3 timed windows"),
    ("[race]\nseeds = 1\n", "--seeds 1: the verdict is a test paired by seed"),
    ("[run\n", "is not valid TOML"),
])
def test_a_bad_config_file_is_one_line_and_exit_2(text, message, tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["run", "--config", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(path) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_toml_round_trips_every_kind_of_value(tmp_path):
    s = Settings(run=RunConfig(preset="tiny", rungs=("eager", "bf16"), hf_set=(), peak_tflops={"bf16": 989.4},
                               data='a "quoted" path\\x.txt', model_changes={"n_embd": 64}),
                 quiet=True)
    s = dataclasses.replace(s, race=dataclasses.replace(s.race, combos=(("bf16",), ("bf16", "muon")),
                                                        target_loss=2.5))
    back = codec.from_data(Settings, settings.read(settings.write(tmp_path / "s.toml", s, "a\nheader", (
        "run", "race", "quiet"))))
    assert back == s


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    write_models(folder)
    return folder


def _one(out):
    d = only_folder(out)
    return d, json.loads((d / "results.json").read_text())


@pytest.mark.parametrize("model", [[], ["--model", "nano.py:GPT"], ["--hf", "gpt2", "--hf-set", "n_layer=1",
                                                                     "--hf-set", "n_embd=32", "--hf-set", "n_head=2"]])
@pytest.mark.slow
def test_run_config_toml_reproduces_the_run_field_for_field_and_check_re_runs_that_model(model, made, tmp_path,
                                                                                          capsys):
    if model and model[0] == "--model":
        model = ["--model", str(made / model[1])]
    if model and model[0] == "--hf":
        pytest.importorskip("transformers")
    assert main(["run", *QUICK, *model, "--out", str(tmp_path / "a")]) == 0
    first, saved = _one(tmp_path / "a")
    assert main(["run", "--config", str(first / settings.CONFIG_FILE), "--out", str(tmp_path / "b")]) == 0
    _second, again = _one(tmp_path / "b")
    drop = ("out",)  # the one field changed on purpose
    assert {k: v for k, v in again["config"].items() if k not in drop} == \
           {k: v for k, v in saved["config"].items() if k not in drop}
    assert again["model"]["kind"] == saved["model"]["kind"] == ("speedladder" if not model else
                                                               "user" if model[0] == "--model" else "hf")
    if not model:  # the preset's re-run is test_compare_check.py's
        return
    # check re-runs the baseline's own model (it used to re-run the preset's GPT)
    capsys.readouterr()
    main(["check", "--baseline", str(first), "--tolerance", "0.9", "--out", str(tmp_path / "c"), "--quiet"])
    _, checked = _one(tmp_path / "c")
    assert checked["model"] == saved["model"] and checked["config"]["model_source"] == saved["config"]["model_source"]
    assert checked["config"]["hf"] == saved["config"]["hf"] and checked["config"]["hf_set"] == saved["config"]["hf_set"]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("check: ")


def test_an_old_results_file_loads_and_its_config_reads_as_todays():
    from speedladder.config.settings import run_from_results
    from speedladder.records import storage

    raw = json.loads((Path(__file__).parents[1] / "fixtures" / "results-schema1.json").read_text())["config"]  # written before the codec
    assert "timing" not in raw
    saved = storage.load(Path(__file__).parents[1] / "fixtures" / "results-schema1.json")
    timing = {k: raw[k] for k in ("steps", "windows", "warmup", "max_warmup")}
    saved_timing = codec.to_data(saved.config.run.timing)
    assert {k: saved_timing[k] for k in timing} == timing and saved.config.steps == raw["steps"]
    run = run_from_results(codec.to_data(saved.config))
    assert (run.preset, run.timing.steps, run.rungs) == ("d2l-cpu", raw["steps"], tuple(raw["rungs"]))


# -- the winner in the user's own loop -----------------------------------------------------------------

def _own_loop(model, spec, batches, **kw):
    """A nanoGPT-style loop: what a user writes around speedladder.apply."""
    model, optimizer, autocast, _ = __import__("speedladder").apply(model, spec, **kw)
    losses = []
    for x, y in batches:
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def _speedladders_step(work, spec, batches):
    step = work.step(spec)
    return [float(step(x, y)) for x, y in batches]


@pytest.mark.parametrize("rungs", [("bf16", "sdpa", "fused-adamw", "pad-vocab", "ckpt"), ("bf16", "batch", "muon")])
def test_apply_in_a_hand_written_loop_matches_speedladders_own_step(rungs, tiny):
    env = Env("cpu", None, 2, batch_lr_scale="sqrt")
    spec = compose(rungs, tiny.base_spec, env)
    stream = tiny.stream(spec)
    batches = [next(stream) for _ in range(6)]
    ours = _speedladders_step(tiny, spec, batches)
    model = GPT(tiny.cfg.model)
    model.load_state_dict(tiny.init)
    theirs = _own_loop(model, spec, batches, lr=tiny.cfg.run.lr)
    torch.testing.assert_close(theirs, ours, rtol=0.0, atol=0.0)  # the same operations in the same order
    assert theirs[-1] < theirs[0]


def test_apply_compiles_in_the_winners_mode_and_sets_tf32(tiny):
    """Compiled lazily: nothing is compiled here (a cold compile is 20 s on 2 cores), the wrapping is checked."""
    spec = dataclasses.replace(tiny.base_spec, compile=True, compile_mode="max-autotune-no-cudagraphs", tf32=True)
    model = GPT(tiny.cfg.model)
    before = torch.get_float32_matmul_precision()
    try:
        applied = __import__("speedladder").apply(model, spec)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert type(applied.model).__name__ == "OptimizedModule" and applied.model._orig_mod is model
    assert applied.spec is spec and isinstance(applied.optimizer, torch.optim.AdamW)


def test_apply_takes_a_user_model_a_config_file_and_the_users_own_optimizer(made, tmp_path):
    spec_path = str(made / "nano.py:GPT")
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=spec_path, rungs=("eager", "bf16", "ckpt",
                                                                                         "fused-adamw")))
    s = settings.write(tmp_path / "winner.toml", Settings(run=work.cfg.run), "test", ("run",))
    spec = compose(("bf16", "ckpt", "fused-adamw"), work.base_spec, work.env)
    stream = work.stream(spec)
    batches = [next(stream) for _ in range(5)]
    ours = _speedladders_step(work, spec, batches)
    model = work.model.build(torch.device("cpu"))
    model.load_state_dict(work.init)
    made_with = []

    def adamw(params, **kind):
        made_with.append(kind)
        return torch.optim.AdamW(params, lr=1e-3, **kind)

    theirs = _own_loop(model, s, batches, optimizer=adamw)
    assert made_with == [{"fused": True}]
    torch.testing.assert_close(theirs, ours, rtol=0.0, atol=0.0)
    assert all(type(b).__name__ == "Checkpointed" for b in model.get_submodule(work.model.blocks))  # in place
    scope = {"speedladder": __import__("speedladder"), "model": work.model.build(torch.device("cpu"))}
    exec(search.commands(str(tmp_path)).apply, scope)  # noqa: S102 (tune's printed line, run as pasted)
    assert scope["spec"] == spec and isinstance(scope["optimizer"], torch.optim.AdamW)


def test_apply_says_in_one_line_what_a_model_cannot_take(made):
    model = user_models.load(str(made / "flat.py:Bigram"))(28)
    spec = StepSpec(4, 32, transforms=("activation-checkpointing",))
    with pytest.raises(UsageError, match="no repeated blocks"):
        __import__("speedladder").apply(model, spec)
    assert RUNGS["ckpt"].requires.model == "blocks"


def _ungrouped(cls: type) -> list[str]:
    """The flags of `cls` whose group no command takes: flags that no command line could ever set."""
    taken = {g for c in ALL for g in c.groups}
    return [path for path, f, _ in leaves(cls) if f.metadata.get("group") not in taken]


def test_every_flag_is_in_a_group_some_command_takes():
    from speedladder.codec import Group, option
    from speedladder.config.settings import Settings

    assert _ungrouped(Settings) == []
    assert {g for c in ALL for g in c.groups} == set(Group)  # and no group is left that nothing takes

    @dataclasses.dataclass(frozen=True)
    class Planted:  # a field declared without a group: the check finds it
        grouped: int = option(1, help="a flag run takes", group=Group.MODEL)
        orphan: int = option(2, help="a flag no command takes")

    assert _ungrouped(Planted) == ["orphan"]
    with pytest.raises(TypeError, match="is a Group, not 'modle'"):  # a misspelt group fails where it is written
        option(1, help="a misspelt group", group="modle")
