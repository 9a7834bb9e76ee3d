"""The speedrun's model records as rungs (rungs/speedrun.py): each changes the function through a hook of the model,
keeps the parameters, stays causal, and is refused where a model has no such hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import Described

from speedladder.config.ladders import LADDERS
from speedladder.config.resolved import resolve
from speedladder.config.run import RunConfig
from speedladder.models.gpt import GPT, GPTConfig
from speedladder.progress import Progress
from speedladder.rungs import MODEL_TRANSFORMS, RUNGS, Env, compose, pad_vocab
from speedladder.spec import StepSpec
from speedladder.step.workload import prepare
from speedladder.verify.gates import Gates

RECORDS = ("qk-norm", "relu2", "rotary", "softcap")
CFG = GPTConfig(vocab_size=28, block_size=16, n_layer=2, n_head=2, n_embd=16, mlp_hidden=32, activation="relu")


def logits(model: GPT, x: torch.Tensor) -> torch.Tensor:
    return model(x)[0]


@pytest.mark.parametrize("name", RECORDS)
def test_each_record_changes_the_function_and_keeps_every_parameter(name):
    torch.manual_seed(0)
    plain = GPT(CFG)
    changed = GPT(CFG)
    changed.load_state_dict(plain.state_dict())
    before = dict(changed.named_parameters())
    spec = RUNGS[name].transform(RUNGS["eager"].transform(StepSpec(2, 16), _env()), _env())
    assert RUNGS[name].kind == "architecture" and spec.transforms == (name,)
    changed = MODEL_TRANSFORMS[name](changed)
    after = dict(changed.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    # (at initialization the logits are ~0.1, where a cap of 15 is nearly the identity: a small change, not none)
    with torch.no_grad():
        assert float((logits(plain, x) - logits(changed, x)).abs().max()) > 1e-7


def _env(shapes: GPTConfig = CFG, **kw) -> Env:
    hooks = tuple(f"speedladder_{h}" for h in ("qk_norm", "relu2", "rotary", "softcap"))
    return Env("cpu", None, 2, model=Described(hooks=hooks, shapes=shapes), **kw)


def test_softcap_bounds_the_logits_and_a_padded_head_stays_masked():
    torch.manual_seed(0)
    model = pad_vocab(GPT(dataclasses.replace(CFG, vocab_size=50)))  # padded to 64 columns
    model.speedladder_softcap(2.0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20)  # large logits, so the cap binds
        out = logits(model, torch.randint(0, 50, (2, 16)))
    real, pad = out[..., :50], out[..., 50:]
    assert real.abs().max() <= 2.0 and real.abs().max() > 1.9
    assert torch.isinf(pad).all() and (pad < 0).all()  # tanh would have lifted them to -2


def test_rotary_replaces_the_learned_positions():
    torch.manual_seed(0)
    model = GPT(CFG)
    model.speedladder_rotary()
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    assert model.wpe.weight.grad is None  # the learned table is no longer added
    odd = dataclasses.replace(CFG, n_embd=18, n_head=2)  # head size 9
    assert "even head size" in RUNGS["rotary"].requires.unmet(_env(shapes=odd))


def test_a_model_without_the_hooks_is_told_why_each_record_does_not_apply():
    bare = Env("cpu", None, 2)
    for name in RECORDS:
        why = RUNGS[name].requires.unmet(bare)
        assert why and f"speedladder_{name.replace('-', '_')}() hook" in why


def test_every_record_is_causal_and_its_own_reference_on_eager(tiny):
    gates = Gates(tiny, Progress(quiet=True))
    for name in RECORDS:
        spec = compose((name,), tiny.base_spec, tiny.env)
        assert gates.is_reference(spec)
        gate, _ = gates.check(tiny.step(spec), None, None, None, lambda m: None)
        assert gate.passed and gate.causality.passed, (name, gate.detail)


def test_a_rung_on_top_of_a_record_is_checked_against_eager_with_that_record(tiny):
    """sdpa after qk-norm computes eager+qk-norm's function: checked against that, by the fp64 rule."""
    gates = Gates(tiny, Progress(quiet=True))
    spec = compose(("qk-norm", "sdpa"), tiny.base_spec, tiny.env)
    ref = gates.reference(spec)
    assert ref.fp64 is not None
    gate, _ = gates.check(tiny.step(spec), ref, None, None, lambda m: None)
    assert gate.passed and gate.equivalence.rule == "fp64", gate.detail
    plain = gates.reference(tiny.base_spec)
    assert ref is not plain  # a reference of its own: eager with qk-norm


def test_the_speedrun_ladder_names_the_records_after_muon():
    cfg = resolve(RunConfig(ladder="speedrun", preset="tiny"), torch.device("cpu"), known_rungs=tuple(RUNGS))
    assert cfg.run.rungs == LADDERS["speedrun"].rungs == ("eager", "compile", "bf16", "muon", *RECORDS)
    assert prepare(RunConfig(preset="tiny", device="cpu")).env.model.hooks  # our GPT has the hooks


def test_race_takes_the_speedrun_ladder_by_name():
    from speedladder import codec
    from speedladder.cli.cmd_race import plan
    from speedladder.config.settings import RaceConfig, Settings

    cfg, race, role = plan(Settings(race=RaceConfig(ladder="speedrun")))
    assert cfg.rungs == race.rungs == LADDERS["speedrun"].rungs and role == "rung"
    assert codec.from_data(RaceConfig, codec.to_data(race)) == race  # saved resolved: --config repeats it


def test_a_raced_record_is_judged_as_a_change_of_learning_at_equal_tokens(tmp_path):
    """An architecture rung changes what is learned per token, so the race also compares the val loss at equal
    tokens, as it does for batch and Muon: a record that only wins by running faster per step is named so."""
    from conftest import cli, only_folder

    rc, _, err = cli("race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,qk-norm", "--seeds", "2",
                     "--calibrate-steps", "20", "--eval-every-base-steps", "10", "--time-cap", "30", "--quiet",
                     "--out", str(tmp_path))
    assert rc == 0, err
    import json
    entries = {e["name"]: e for e in json.loads((only_folder(tmp_path) / "results.json").read_text())["race"]["entries"]}
    record = entries["qk-norm"]
    assert record["status"] == "ok" and record["causality"]["passed"] and record["kind"] == "architecture"
    assert record["changes_learning"] and not entries["eager"]["changes_learning"]
    assert record["spec"]["transforms"] == ["qk-norm"] and len(record["runs"]) == 2
