"""The kink census (verify/kink_census.py, the `kink_census` switch): it sees ReLU's zero, a clamp's bounds and a
max's ties in any model, counts on the device, and moves the probe where no rounding can cross one; switched off,
a rung that crosses a kink fails (docs/measurement.md, rule 12)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import plant, swap_attention
from planted import ISA, KINK_AT, NoCausalMask, WrongScale, check_after, cross_the_kink, plant_kink, skip_last_block
from torch import nn

from speedladder.config.run import RunConfig
from speedladder.progress import Progress
from speedladder.rungs import rounding_fuzz
from speedladder.step.workload import prepare
from speedladder.verify import curves, kink_census
from speedladder.verify.gates import Gates
from speedladder.verify.tolerance import Refinements

SEEDS = (0, 1, 2)


class Kinky(nn.Module):
    """relu, clamp, abs, a max over a dimension, a comparison of two activations, top-k; and a constant compared
    with 0 (a mask), which rounding cannot move."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[-1]) == 0
        y = F.relu(x) + x.clamp(-0.5, 0.5) + x.abs() + x.amax(-1, keepdim=True) + (x > x.flip(-1)).float()
        return y.masked_fill(mask, 0.0) + x.topk(2, dim=-1).values.sum(-1, keepdim=True)


def _seen(x: torch.Tensor) -> kink_census._Seen:
    seen = kink_census._Seen()
    with torch.no_grad(), kink_census._Census(seen):
        Kinky()(x)
    return seen


def test_the_census_sees_every_kink_and_tie_and_counts_those_within_rounding():
    torch.manual_seed(0)
    x64 = torch.randn(4, 3, 8, dtype=torch.float64)
    x64[1, 2, 5] = 1e-9  # within rounding of ReLU's and abs's zero
    x64[2, 0, 3] = 0.5 + 1e-9  # within rounding of the clamp's upper bound
    seen64 = _seen(x64)
    ops = [name for name, _ in seen64.ops]
    for op in ("relu", "clamp", "abs", "amax", "gt", "topk"):
        assert op in ops, ops
    assert "eq" in ops  # the constant mask is seen ...
    c = kink_census.count(seen64, _seen(x64.float().double() * (1 + 1e-7)), rows=4)
    assert c.why == "" and c.ops == len(ops)
    assert c.by_op.get("relu") == 1 and c.by_op.get("abs") == 1 and c.by_op.get("clamp") == 1, c.by_op
    assert "eq" not in c.by_op  # ... and never counted: it deviates by nothing at any precision
    assert c.rows == {1, 2} and c.unplaced == 0  # the sequences the near elements lie in
    assert set(c.flippable) and all(t.device == x64.device for t in c.flippable.values())  # indices, where they were


def test_the_census_of_a_model_counts_the_float64_run_against_eagers_as_it_goes(tiny):
    """A model's census pairs the float64 forward with eager's op by op while it runs: the same count as pairing two
    recorded runs afterwards, and what stays of eager's run is its distances, not a copy in float64."""
    step, step64 = tiny.step(tiny.base_spec), tiny.step(tiny.base_spec, dtype=torch.float64)
    batch = tiny.gate_batches(tiny.base_spec, 1)[0]
    at = {n: w * 3 for n, w in tiny.init.items()}
    streamed = kink_census.census(step64, step, at, batch)
    eager = kink_census.record(step, at, batch)
    assert all(t.dtype == torch.float32 for _, ds in eager.ops for t in ds)
    truth = kink_census.record(step64, at, batch)
    paired = kink_census.count(truth, eager, batch[0].shape[0])
    assert (streamed.ops, streamed.elements, streamed.near, streamed.rows) == (paired.ops, paired.elements,
                                                                                paired.near, paired.rows)


def test_two_runs_that_do_not_pair_are_refused_not_guessed():
    seen = _seen(torch.randn(2, 8, dtype=torch.float64))
    fewer = kink_census._Seen(seen.ops[:-1])
    c = kink_census.count(seen, fewer, rows=2)
    assert c.why and "cannot pair" in c.why and c.near == 0


GELU_MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class GeluLM(nn.Module):
    def __init__(self, vocab_size, block_size, width=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        att = (q @ k.transpose(-2, -1)) / x.shape[-1] ** 0.5
        att = att.masked_fill(self.bias[:T, :T] == 0, float("-inf")).softmax(-1)  # nanoGPT's mask
        x = x + self.proj(att @ v)
        x = x + self.out(F.gelu(self.fc(self.ln(x))))
        return self.head(x)
"""


def test_a_model_without_kinks_has_a_census_of_zero_written_as_such(tmp_path):
    """GELU everywhere and a causal mask from a comparison of constants: a census of 0, recorded as 0."""
    (tmp_path / "gelu.py").write_text(GELU_MODEL)
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=f"{tmp_path / 'gelu.py'}:GeluLM"))
    gates = Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    for k in ("trained", "probe"):
        census = ref.kinks[k]
        assert census.ran and census.near == 0 and census.near_first == 0 and census.probe == "gate batch 0"
    gate, _ = gates.check(work.step(dataclasses.replace(work.base_spec, optimizer="adamw-foreach")), ref,
                          ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    assert gate.equivalence.fp64.kinks.near == 0 and gate.differential.fp64.kinks.near == 0


@pytest.fixture
def fuzz(monkeypatch):
    def use(seed: int, scale: float = 1.0) -> None:
        plant(monkeypatch, "fuzz", rounding_fuzz(scale=scale, seed=seed))
    return use


@pytest.fixture(scope="module")
def kinked(tiny):
    """The tiny reference with a planted kink, and bf16 gated on it."""
    mp = pytest.MonkeyPatch()
    mp.setattr(curves, "loss_curve", plant_kink(tiny))
    try:
        gates = Gates(tiny, Progress(quiet=True))
        ref = gates.reference(tiny.base_spec)
    finally:
        mp.undo()
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    gate, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


@ISA
def test_a_planted_kink_is_seen_and_the_probe_moves_off_it(kinked):
    _, ref, _, _ = kinked
    census = ref.kinks["probe"]
    assert census.ran and census.near_first >= 1 and census.by_op.get("relu", 0) >= 1, census
    assert census.near == 0 and census.rows, census  # the sequence holding it was replaced
    assert census.rows[KINK_AT[1]][0] == 1, census.rows  # ... by a clean one of the second gate batch


@ISA
def test_the_probe_holds_distinct_sequences(kinked):
    """A probe batch never holds one sequence twice: the clean rows it keeps and the ones it takes are all
    different (the small run's probe was once 64 copies of one sequence)."""
    _, ref, _, _ = kinked
    rows = [tuple(r.tolist()) for r in ref.batch[0]]
    assert len(set(rows)) == len(rows)


@ISA
@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_at_a_planted_kink_the_fuzz_passes_and_wrong_rungs_are_still_caught(tiny, kinked, fuzz, monkeypatch,
                                                                                position):
    for seed in SEEDS:
        fuzz(seed)
        gate = check_after(tiny, kinked, position, ("fuzz",))
        assert gate.passed, f"seed {seed}: {gate.detail}"
    for name, fn in {"no-causal-mask": swap_attention(NoCausalMask), "wrong-scale": swap_attention(WrongScale),
                     "skip-block": skip_last_block}.items():
        plant(monkeypatch, name, fn)
        assert not check_after(tiny, kinked, position, (name,)).passed, name


@ISA
def test_a_rung_that_crosses_a_kink_passes_by_the_census_and_fails_without_it(tiny, monkeypatch):
    """The control of the control, on any processor: a rung that only re-rounds, and by construction crosses the
    planted kink (cross_the_kink), passes where the census moved the probe off it, and fails the same gate with
    the census switched off (the probe left on gate batch 0): no seed's luck decides whether the plant tests
    anything."""
    gates_of = {}
    for census in (True, False):
        curve = plant_kink(tiny)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(curves, "loss_curve", curve)
            gates = Gates(tiny, Progress(quiet=True), Refinements(kink_census=census))
            ref = gates.reference(tiny.base_spec)
        seen = ref.kinks.get("probe")
        assert (seen is not None and seen.near_first >= 1) if census else not ref.kinks, ref.kinks
        plant(monkeypatch, "cross-kink", cross_the_kink(curve.planted))
        spec = dataclasses.replace(tiny.base_spec, transforms=("cross-kink",))
        gates_of[census], _ = gates.check(tiny.step(spec), ref, ref.probe, "eager", lambda m: None)
    assert gates_of[True].passed, gates_of[True].detail
    assert not gates_of[False].passed, "a rung that crossed a kink at the probe passed without the census"
    assert "grad" in gates_of[False].detail, gates_of[False].detail  # ReLU's gradient moved, not its value


def test_a_census_that_cannot_run_says_why_and_the_gate_judges_by_fp64_as_before(tiny, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no dispatch here")
    monkeypatch.setattr(kink_census, "choose_probe", broken)
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    assert not ref.kinks["probe"].ran and "kink census failed" in ref.kinks["probe"].detail
    assert ref.fp64 is not None  # the truth does not depend on the census
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, transforms=("sdpa",))), ref, ref.probe,
                          "eager", lambda m: None)
    assert gate.passed and gate.differential.fp64.kinks is not None and not gate.differential.fp64.kinks.ran
    assert gate.differential.fp64.truth == "fp64"
