"""The training recipe (config/recipe.py, step/schedule.py): nanoGPT's values by name, the same weights as a
hand-written nanoGPT loop, the schedule as a race's budget, speedladder.apply's parts, --threads, the bad input,
and run and race end to end (docs/usage.md#the-recipe). The accum and fp16 rungs: test_recipe_rungs.py."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
import torch
from conftest import cli, header_of, only_folder
from torch.utils._python_dispatch import TorchDispatchMode

import speedladder
from speedladder import codec
from speedladder.config import settings
from speedladder.config.recipe import RECIPES, RecipeConfig
from speedladder.config.run import RunConfig
from speedladder.config.settings import Settings
from speedladder.errors import UsageError
from speedladder.models.gpt import GPT
from speedladder.rungs import RUNGS, compose
from speedladder.step.schedule import Schedule, Span, param_groups, race_length, schedule_of
from speedladder.step.workload import prepare
from speedladder.train.trainer import train_loop

CPU = torch.device("cpu")


def nanogpt_get_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """nanoGPT's train.py get_lr, as it is written there."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def nanogpt_loop(model, batches, lr, accum, warmup, decay_iters, clip, norms=None):
    """nanoGPT's train.py loop by hand: configure_optimizers' 2-D split at weight decay 0.1, betas (0.9, 0.95),
    get_lr before each iteration, loss / accum backpropagated per micro-step, clip_grad_norm_, step, zero_grad."""
    params = dict(model.named_parameters())
    groups = [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
    for it, (x, y) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = nanogpt_get_lr(it, lr, warmup, decay_iters, lr / 10)
        for xs, ys in zip(x.chunk(accum), y.chunk(accum)):
            _, loss = model(xs, ys)
            (loss / accum).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def nanogpt_workload(**recipe):
    return prepare(RunConfig(preset="tiny", device="cpu", lr=3e-3, recipe=RecipeConfig.named("nanogpt", **recipe)))


# -- the configuration ---------------------------------------------------------------------------------------------

def test_the_default_recipe_is_what_speedladder_always_trained():
    r = RecipeConfig()
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]).defaults
    assert (r.weight_decay, r.betas, r.eps) == (adamw["weight_decay"], adamw["betas"], adamw["eps"])
    assert r.decay == "all" and not r.clips and not r.scheduled and r.is_default and r.accum_steps is None
    assert RecipeConfig.named("default") == r


def test_nanogpt_names_nanogpts_values_and_a_flag_beside_it_wins():
    r = RecipeConfig.named("nanogpt")
    assert (r.weight_decay, r.decay, r.betas, r.grad_clip, r.schedule, r.floor) == (0.1, "2d", (0.9, 0.95), 1.0,
                                                                                   "cosine", 0.1)
    assert r.warmup_share == pytest.approx(2000 / 600000) and r.changes() == {} and not r.is_default
    rc, _, err = cli("run", "--preset", "tiny", "--recipe", "nanogpt", "--weight-decay", "0.05", "--rungs",
                     "eager,nope")  # refused after the settings are made: nothing runs
    assert rc == 2 and "unknown rung" in err
    from speedladder.cli import build_parser
    from speedladder.cli.gen import to_settings

    ns, _ = build_parser().parse_known_args(["run", "--recipe", "nanogpt", "--weight-decay", "0.05"])
    got = to_settings(ns).run.recipe
    assert (got.name, got.weight_decay, got.betas, got.grad_clip) == ("nanogpt", 0.05, (0.9, 0.95), 1.0)
    assert got.changes() == {"weight_decay": 0.05} and "nanogpt with weight_decay=0.05" in got.describe()


def test_a_recipe_goes_through_config_toml_and_results_json_unchanged(tmp_path):
    off = RecipeConfig.named("nanogpt", grad_clip=math.inf, warmup=7, unit="tokens", accum_steps=2)
    s = Settings(run=RunConfig(recipe=off))
    path = settings.write(tmp_path / "c.toml", s, "test", ("run",))
    assert "[run.recipe]" in path.read_text() and "grad_clip = inf" in path.read_text()
    back = codec.from_data(Settings, settings.read(path)).run.recipe
    assert back == off and not back.clips
    # JSON has no infinity: results.json holds null for an unclipped recipe, which reads back as off.
    data = json.loads(json.dumps(codec.to_data(off, json=True)))
    assert data["grad_clip"] is None and codec.from_data(RecipeConfig, data, unknown="skip") == off
    assert RECIPES["nanogpt"]["betas"] == (0.9, 0.95)


# -- the schedule --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_the_schedule_is_nanogpts_get_lr(kind):
    s = Schedule(kind, Span(10, "steps"), Span(100, "steps"), 0.1)
    for it in range(0, 130, 3):
        if kind == "cosine":
            want = nanogpt_get_lr(it, 1.0, 10, 100, 0.1)
        elif kind == "linear":
            want = (it + 1) / 11 if it < 10 else 0.1 if it > 100 else 0.1 + (1 - (it - 10) / 90) * 0.9
        else:
            want = (it + 1) / 11 if it < 10 else 1.0
        assert s.factor(it, 256) == pytest.approx(want, rel=1e-12)
    # In tokens: the same schedule for updates of 256 tokens.
    tokens = Schedule(kind, Span(2560, "tokens"), Span(25600, "tokens"), 0.1)
    assert [tokens.factor(i, 256) for i in range(120)] == pytest.approx([s.factor(i, 256) for i in range(120)])


def test_a_schedule_is_as_long_as_the_commands_training_unless_the_recipe_says():
    cos = RecipeConfig.named("default", schedule="cosine", warmup_share=0.1)
    s = schedule_of(cos, Span(300, "steps"), 128)
    assert (s.length, s.warmup) == (Span(300, "steps"), Span(30, "steps"))
    s = schedule_of(dataclasses.replace(cos, length=50), Span(300, "steps"), 128)
    assert s.length == Span(50, "steps")
    s = schedule_of(cos, Span(300 * 128, "tokens"), 128, tokens_only=True)  # a race: tokens throughout
    assert s.length == Span(300 * 128, "tokens") and s.warmup.unit == "tokens"
    with pytest.raises(UsageError, match="not shorter than the schedule"):
        schedule_of(dataclasses.replace(cos, warmup=300), Span(300, "steps"), 128)


def test_a_schedules_length_is_the_races_budget():
    cos = RecipeConfig.named("nanogpt")
    assert race_length(RecipeConfig(), None, 200, 128) == (None, 200, Span(200 * 128, "tokens"))  # unchanged
    assert race_length(cos, None, 200, 128)[:2] == (200, 200)
    assert race_length(cos, 300, 200, 128) == (300, 300, Span(300 * 128, "tokens"))  # the calibration to its end
    assert race_length(dataclasses.replace(cos, length=80), None, 200, 128)[:2] == (80, 80)
    assert race_length(cos, 0, 200, 128) == (0, 200, Span(200 * 128, "tokens"))  # the criterion stays off
    with pytest.raises(UsageError, match="a schedule's length is the race's budget"):
        race_length(dataclasses.replace(cos, length=80), 300, 200, 128)


def test_the_2d_split_is_nanogpts_configure_optimizers(tiny):
    model = GPT(tiny.cfg.model)
    groups = param_groups(dict(model.named_parameters()), RecipeConfig.named("nanogpt"))
    assert isinstance(groups[0], dict) and isinstance(groups[1], dict)
    decay, nodecay = groups[0]["params"], groups[1]["params"]
    assert groups[1]["weight_decay"] == 0.0 and "weight_decay" not in groups[0]
    assert {id(p) for p in decay} == {id(p) for p in model.parameters() if p.dim() >= 2}
    assert nodecay and all(p.dim() == 1 for p in nodecay)
    assert param_groups(dict(model.named_parameters()), RecipeConfig()) == list(model.parameters())


# -- the step against a hand-written nanoGPT loop -----------------------------------------------------------------

def test_the_clipped_scheduled_accumulated_step_trains_nanogpts_weights():
    work = nanogpt_workload(warmup=3, length=8)  # 10 updates: warm-up, cosine decay, then the floor
    spec = RUNGS["accum"].transform(work.base_spec, work.env)
    assert (spec.batch_size, spec.accum, spec.micro_batch) == (8, 2, 4)
    stream = work.stream(spec)
    batches = [next(stream) for _ in range(10)]
    step = work.step(spec)
    for x, y in batches:
        step(x, y)
    ours = step.reference_state()
    model = GPT(work.cfg.model)
    model.load_state_dict(work.init)
    norms: list[float] = []
    theirs = nanogpt_loop(model, batches, 3e-3, 2, 3, 8, 1.0, norms)
    assert max(norms) > 1.0  # clipping did act
    for name, w in theirs.items():
        torch.testing.assert_close(ours[name], w, rtol=1e-5, atol=1e-6)  # within fp32 rounding
    # The test can fail: the same loop without clipping trains other weights, far outside that rounding.
    model.load_state_dict(work.init)
    unclipped = nanogpt_loop(model, batches, 3e-3, 2, 3, 8, None)
    assert max(float((unclipped[n] - w).abs().max()) for n, w in theirs.items()) > 1e-3


def test_apply_hands_back_the_recipes_parts_and_a_plain_loop_trains_what_train_trains(tmp_path):
    work = nanogpt_workload(warmup=2)
    run = dataclasses.replace(work.cfg.run, rungs=("eager", "accum"))
    path = settings.write(tmp_path / "winner.toml", Settings(run=run), "test", ("run",))
    spec = compose(("accum",), work.base_spec, work.env)
    steps = 8
    work.with_horizon(Span(steps, "steps"))  # as train does: the schedule as long as its --steps
    trained = train_loop(work, spec, steps, log_every=100, log=lambda line: None)
    model = GPT(work.cfg.model)
    model.load_state_dict(work.init)
    applied = speedladder.apply(model, path, steps=steps)
    model, optimizer, autocast, got = applied  # it unpacks as it always did
    assert got == spec and applied.accum == 2 and applied.grad_clip == 1.0 and applied.scaler is None
    assert applied.scheduler is not None and applied.scheduler.get_last_lr()[0] == pytest.approx(3e-3 / 3)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    stream = work.stream(spec)
    for _ in range(steps):
        x, y = next(stream)
        for xs, ys in zip(x.chunk(applied.accum), y.chunk(applied.accum)):
            with autocast:
                _, loss = model(xs, ys)
            (loss / applied.accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), applied.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        applied.scheduler.step()
    for name, w in model.state_dict().items():
        torch.testing.assert_close(w, trained.state[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(UsageError, match="give apply"):
        speedladder.apply(GPT(work.cfg.model), path)  # a schedule over the training's length needs its length


def test_clipping_scheduling_and_accumulating_read_nothing_back_to_the_host():
    """docs/measurement.md, rule 3: clip_grad_norm_ scales the gradients on the device, the schedule is host
    arithmetic on the update's count; the only reads are AdamW's step counters, host tensors by design."""
    work = nanogpt_workload(warmup=2)
    spec = RUNGS["accum"].transform(work.base_spec, work.env)
    step, stream = work.step(spec), work.stream(spec)
    step(*next(stream))
    read_back = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:  # what .item() dispatches to
                read_back.append(args[0])
            return func(*args, **(kwargs or {}))

    lr = step.optimizer.param_groups[0]["lr"]
    with Spy():
        for _ in range(2):
            step(*next(stream))
    assert step.optimizer.param_groups[0]["lr"] != lr  # the schedule moved
    counters = [st["step"] for st in step.optimizer.state.values()]
    assert all(any(t is c for c in counters) for t in read_back), "a step read a computed value back"


def test_a_restored_step_goes_on_with_its_schedule_and_its_scaler():
    """A checkpoint's round trip of a scheduled fp16 step: the rate and the scale go on from where they were, and
    the next steps are the same, bit for bit."""
    work = nanogpt_workload(warmup=2, length=6)
    spec = RUNGS["fp16"].transform(work.base_spec, work.env)
    step, stream = work.step(spec), work.stream(spec)
    for _ in range(4):
        step(*next(stream))
    assert step.scaler is not None
    buffer = io.BytesIO()  # as a checkpoint holds them: copies, not the live optimizer's tensors
    torch.save({"model": step.reference_state(), "beyond": step.beyond_reference(),
                "optimizer": step.optimizer.state_dict(), "stream": stream.state(), "updates": step.updates,
                "scaler": step.scaler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    again, other = work.step(spec), work.stream(spec)
    again.restore(saved["model"], saved["beyond"], saved["optimizer"], saved["updates"], saved["scaler"])
    other.load_state(saved["stream"])
    assert again.optimizer.param_groups[0]["lr"] == step.optimizer.param_groups[0]["lr"] < 3e-3
    for _ in range(4):  # through the end of the decay, to the floor
        assert torch.equal(step(*next(stream)), again(*next(other)))
    assert again.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
    assert all(torch.equal(p, again.params[n]) for n, p in step.params.items())


# -- bad input: one line, exit 2, nothing measured lost ---------------------------------------------------------------

@pytest.mark.parametrize("command, args, message", [
    ("run", ["--weight-decay", "-0.1"], "weight decay must be zero or more, got -0.1"),
    ("run", ["--betas", "0.9,1.0"], "betas must be two numbers in [0, 1), got 0.9,1.0"),
    ("race", ["--betas=-0.1,0.95"], "betas must be two numbers in [0, 1)"),
    ("run", ["--grad-clip", "0"], "the clip norm must be positive (or off), got 0.0"),
    ("train", ["--grad-clip", "-1"], "the clip norm must be positive"),
    ("run", ["--lr-warmup", "50", "--schedule-length", "20"], "a warm-up of 50 steps is longer than the schedule's 20"),
    ("train", ["--lr-schedule", "cosine", "--lr-warmup", "40", "--steps", "30"], "not shorter than the schedule"),
    ("run", ["--accum-steps", "3"], "--accum-steps 3 does not divide the batch rung's multiplier 2"),
    ("run", ["--rungs", "eager,bf16,fp16"], "bf16 and fp16 are two precisions of one step"),
    ("train", ["--compose", "fp16,bf16"], "two precisions of one step"),
    ("run", ["--threads", "0"], "--threads must be positive, got 0"),
    ("race", ["--threads", "0"], "--threads must be positive, got 0"),
])
def test_bad_recipe_input_is_one_line_and_exit_2(command, args, message, tmp_path):
    rc, _, err = cli(command, "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path), *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not list(tmp_path.iterdir())  # refused before any folder is made


# -- end to end --------------------------------------------------------------------------------------------------

@pytest.fixture
def threads_back():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


QUICK = ["--preset", "tiny", "--device", "cpu", "--no-profile", "--window-steps", "2", "--windows", "3",
         "--loss-steps", "4", "--learns-steps", "0", "--no-process-peak", "--quiet"]


@pytest.mark.slow
def test_run_with_the_nanogpt_recipe_shows_it_measures_accum_beside_batch_and_counts_fp16s_skips(tmp_path,
                                                                                                threads_back):
    # --stack-all: accum builds on batch whether or not batch paid on this machine (a speed verdict, not this test's)
    rc, out, err = cli("run", *QUICK, "--recipe", "nanogpt", "--threads", "2", "--stack-all",
                       "--rungs", "eager,fp16,batch,accum", "--out", str(tmp_path))
    assert rc == 0, err
    folder = only_folder(tmp_path)
    saved = json.loads((folder / "results.json").read_text())
    assert saved["config"]["recipe"]["name"] == "nanogpt" and saved["config"]["recipe"]["decay"] == "2d"
    assert saved["config"]["threads"] == 2 and saved["environment"]["cpu_threads"] == 2
    assert saved["schedule"].startswith("cosine decay to 0.1x at 4 steps")  # the run's longest training: 4 steps
    assert "· recipe nanogpt · 2 threads ·" in header_of(out)
    assert "recipe: nanogpt: AdamW weight decay 0.1 on 2-D parameters, betas 0.9,0.95" in out
    rungs = {r["name"]: r for r in saved["rungs"]}
    fp16, batch, accum = rungs["fp16"], rungs["batch"], rungs["accum"]
    assert fp16["gate"]["passed"] and isinstance(fp16["scaler_skipped"], int) and fp16["scaler_updates"] > 0
    assert f"fp16: the gradient scaler skipped {fp16['scaler_skipped']} of" in out
    # accum: the batch rung's batch in micro-steps, gated at its shape against batch itself, timed beside it.
    assert accum["built_on"] == "batch" and accum["spec"]["batch_size"] == batch["spec"]["batch_size"]
    assert accum["gate"]["passed"] and accum["gate"]["differential"]["base"] == "batch"
    assert accum["speedup_prev"] is not None and accum["base_tokens_per_s"] is not None
    # What one forward keeps for backward, counted: a micro-batch's, half the batch's at 2 micro-steps.
    assert accum["saved_activation_bytes"] < 0.6 * batch["saved_activation_bytes"]
    assert "accum: B=8 in 2 micro-steps of 4" in out
    toml = (folder / "config.toml").read_text()
    assert "[run.recipe]" in toml and 'name = "nanogpt"' in toml and "threads = 2" in toml


@pytest.mark.slow
def test_race_with_the_nanogpt_recipe_trains_its_schedule_over_the_budget(tmp_path):
    rc, out, err = cli("race", "--preset", "tiny", "--device", "cpu", "--recipe", "nanogpt", "--rungs", "eager,accum",
                       "--seeds", "2", "--calibrate-steps", "30", "--eval-every-base-steps", "10", "--quiet",
                       "--out", str(tmp_path))
    assert rc == 0, err
    saved = json.loads((only_folder(tmp_path) / "results.json").read_text())
    race = saved["race"]
    assert race["budget_steps"] == race["calibrate_steps"] == 30
    tokens = 30 * 4 * 32
    assert saved["schedule"].endswith(f"cosine decay to 0.1x at {tokens:,} tokens")
    assert saved["config"]["recipe"]["name"] == "nanogpt" and "· recipe nanogpt ·" in header_of(out)
    assert all(e["status"] == "ok" for e in race["entries"])
