"""The memory meters against known quantities: a hand count of what a small MLP saves, shapes, a known allocation."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from conftest import resolved
from torch import nn

from speedladder.cli import main
from speedladder.config.run import MemoryConfig
from speedladder.ladder import rung_memory
from speedladder.measure import devicemem, memory
from speedladder.records import Environment, Results, RungResult, SavedModel
from speedladder.report.memory_notes import bar_label, memory_notes, peak_cell, short_bytes
from speedladder.rungs import Checkpointed, compose
from speedladder.spec import StepSpec

F32 = 4  # bytes


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # 3 rows in, 8 hidden, 2 out


def test_saved_activations_of_a_small_mlp_match_a_hand_count():
    model, x = mlp(), torch.randn(3, 4)
    saved = memory.count_saved(lambda: model(x).sum(), model.parameters())
    # Linear 1 saves its input x (3x4) for its weight's gradient (x needs none, so W1 is not saved); ReLU saves its
    # output (3x8), which Linear 2 saves again as its input: one storage, counted once. Linear 2 saves W2 (2x8)
    # for the gradient of its input: a parameter, state rather than activation.
    assert saved.activation_bytes == (3 * 4 + 3 * 8) * F32 == 144
    assert saved.tensors == 2
    assert saved.state_bytes == 2 * 8 * F32
    # With an input that needs its gradient, Linear 1 also saves W1 (8x4): state again, activations unchanged.
    xg = x.clone().requires_grad_()
    saved = memory.count_saved(lambda: model(xg).sum(), model.parameters())
    assert saved.activation_bytes == 144 and saved.state_bytes == (2 * 8 + 8 * 4) * F32


def test_views_of_one_tensor_count_once_and_a_checkpoint_keeps_its_input_only():
    lin = nn.Linear(4, 8)
    x = torch.randn(3, 4)

    def halves() -> torch.Tensor:
        a, b = lin(x).split(4, dim=1)  # two views of one (3, 8) output
        return (a * b).sum()  # mul saves both views

    saved = memory.count_saved(halves, lin.parameters())
    assert saved.activation_bytes == (3 * 4 + 3 * 8) * F32  # x, and the (3, 8) output once
    model = mlp()
    ckpt = Checkpointed(model)
    saved = memory.count_saved(lambda: ckpt(x).sum(), model.parameters())
    assert saved.activation_bytes == 3 * 4 * F32 and saved.tensors == 1  # the block's input: the rest is recomputed


def test_a_saved_tensor_is_freed_once_counted():
    """The forward is never followed by its backward: the hook must not keep the saved tensor itself, whose grad_fn
    (the node that saved it) would hold it back in a cycle that gc cannot break (ReLU saves its own output)."""
    x = torch.randn(256, 256, requires_grad=True)
    seen: list[weakref.ref[torch.Tensor]] = []

    def forward() -> torch.Tensor:
        y = x.relu()
        seen.append(weakref.ref(y))
        return (y * 2).sum()

    saved = memory.count_saved(forward, [])
    assert saved.activation_bytes == 256 * 256 * F32  # ReLU's output, counted while it lived
    assert seen[0]() is None  # freed by reference counting, without gc
    gc.collect()
    assert seen[0]() is None


def live_tensor_bytes(leave_out: Iterable[torch.Tensor] = ()) -> int:
    """What Python still holds in tensors once gc has collected what it can: each storage once, by its address;
    `leave_out`'s storages left out."""
    gc.collect()
    left = {(str(t.device), t.untyped_storage().data_ptr()) for t in leave_out}
    held: dict[tuple[str, int], int] = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor):  # type(): isinstance would read every object's __class__
            storage = o.untyped_storage()
            try:
                key = (str(o.device), storage.data_ptr())
            except RuntimeError:  # a fake or functional tensor a compile left behind: it holds no memory
                continue
            if key not in left:
                held[key] = storage.nbytes()
    return sum(held.values())


def test_a_ladder_holds_no_more_after_each_rung(tmp_path, monkeypatch):
    """Four rungs of one shape in one process: once the first has made the gates' eager reference, what the process
    holds in tensors before each rung's measurement (and after the last) does not grow, the probes the gates keep for
    each rung that passed left aside. A forward metered without its backward that kept its graph would add at least
    that rung's saved activations each time."""
    from speedladder.config.run import GateConfig, ProfileConfig, RunConfig, TimingConfig
    from speedladder.ladder import climb as climbing
    from speedladder.step.workload import prepare

    run = RunConfig(preset="tiny", device="cpu", rungs=("eager", "sdpa", "pad-vocab", "ckpt"),
                    timing=TimingConfig(steps=2, windows=3), gates=GateConfig(loss_steps=2),
                    profile=ProfileConfig(enabled=False), memory=MemoryConfig(process_peak=False))
    climb = climbing.Ladder(prepare(run), tmp_path)
    held: list[int] = []

    def probes() -> list[torch.Tensor]:
        return [t for p in climb.probes.values() for t in (p.logits, *p.grads.values())]

    def measure_spec(*args, **kwargs):
        held.append(live_tensor_bytes(probes()))
        return measure(*args, **kwargs)

    measure = climbing.measure_spec
    monkeypatch.setattr(climbing, "measure_spec", measure_spec)
    climb._climb_all()
    held.append(live_tensor_bytes(probes()))
    assert [r.status for r in climb.results.rungs] == ["ok"] * 4
    least = min(r.saved_activation_bytes or 0 for r in climb.results.rungs)
    assert least > 0
    assert max(held[1:]) - min(held[1:]) < least / 10, held


def test_a_cuda_peak_is_over_what_the_process_held_at_the_reset(monkeypatch):
    """The allocator's figures faked (GiB, as the H200's GPT-2 run of 2026-12-04 at 837fae3 had them at its sdpa
    rung: 62.6 peak, where a fresh process peaked at 16.0): the peak is the rung's own, what was held stated apart.
    Off CUDA there is nothing to reset and no peak."""
    gib = 2**30
    stats = {"memory_allocated": 46 * gib, "memory_reserved": 48 * gib, "max_memory_allocated": 62 * gib,
             "max_memory_reserved": 66 * gib}
    resets: list[torch.device] = []
    for name, value in stats.items():
        monkeypatch.setattr(torch.cuda, name, lambda device, v=value: v)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    cuda = torch.device("cuda")
    held = devicemem.reset_peak_memory(cuda)
    assert resets == [cuda] and held == devicemem.Held(46 * gib, 48 * gib)
    assert devicemem.peak_memory(cuda, held) == 16 * gib and devicemem.peak_reserved(cuda, held) == 18 * gib
    assert devicemem.peak_memory(cuda) == 62 * gib  # no reset read: the whole process's peak
    cpu = torch.device("cpu")
    assert devicemem.reset_peak_memory(cpu) is None and devicemem.peak_memory(cpu, None) is None
    # The note says what the peaks leave out.
    r = RungResult(name="sdpa", rung="sdpa", role="rung", reason="", kind="speed", built_on=None, spec=StepSpec(16, 1024),
                   precision="bf16", requirement={}, status="ok", saved_activation_bytes=9 * gib,
                   peak_memory_bytes=16 * gib, peak_reserved_bytes=18 * gib, held_before_bytes=46 * gib)
    res = Results(schema="", status="complete", created="", command=[], config=resolved(), environment=Environment(),
                  model=SavedModel(), rungs=[r])
    assert "each over what the process held before its rung (46.0 GiB" in memory_notes(res)[0]
    r.held_before_bytes = None  # a file from before the field: nothing said
    assert "held" not in memory_notes(res)[0]


@pytest.mark.parametrize("names", [("eager",), ("ckpt",), ("bf16",), ("bf16", "ckpt"), ("sdpa",), ("pad-vocab",),
                                   ("batch",)])
def test_prediction_from_shapes_is_what_eager_autograd_saves(tiny, names):
    spec = compose(names, tiny.base_spec, tiny.env)
    x, y = next(tiny.stream(spec))
    measured = rung_memory.step_saved(tiny.step(spec), x, y).activation_bytes
    predicted, why = rung_memory.predicted_activation_bytes(tiny.cfg.model, spec)
    assert predicted == measured, why


def test_prediction_says_checkpointing_keeps_several_times_less(tiny):
    eager, _ = rung_memory.predicted_activation_bytes(tiny.cfg.model, tiny.base_spec)
    ckpt, _ = rung_memory.predicted_activation_bytes(tiny.cfg.model, compose(("ckpt",), tiny.base_spec, tiny.env))
    fp8, why = rung_memory.predicted_activation_bytes(tiny.cfg.model, compose(("fp8",), tiny.base_spec, tiny.env))
    assert eager > 3 * ckpt and fp8 is None and why
    assert rung_memory.predicted_activation_bytes(None, tiny.base_spec)[0] is None  # not our GPT: no account


@pytest.mark.slow
def test_the_counter_sees_a_compiled_step_without_recompiling(tiny):
    from speedladder.measure import counters

    spec = compose(("compile",), tiny.base_spec, tiny.env)
    step = tiny.step(spec)
    stream = tiny.stream(spec)
    for _ in range(2):
        step(*next(stream))
    before = counters.compile_count()
    saved = rung_memory.step_saved(step, *next(stream))
    assert counters.compile_count() == before
    assert saved.activation_bytes > 0  # inductor's partitioner saves its own choice, counted the same way


@pytest.mark.skipif(memory.process_peak_unsupported() is not None, reason="needs Linux's /proc/self/clear_refs")
def test_resident_peak_sees_a_known_allocation():
    mib = 2**20

    def allocates() -> None:
        t = torch.ones(64 * mib // F32)  # 64 MiB, written: resident while it lives, returned when freed
        t.sum()

    big = memory.resident_peak(allocates, warmup=1, steps=1)
    idle = memory.resident_peak(lambda: None, warmup=1, steps=1)
    assert 60 * mib <= big["process_peak_bytes"] - big["process_base_bytes"] <= 80 * mib
    assert idle["process_peak_bytes"] - idle["process_base_bytes"] < 8 * mib


def test_memory_cells_and_notes_from_saved_records():
    def rec(name: str, kind: str, saved: int, pred: int, base: int, peak: int, built_on: str | None) -> RungResult:
        return RungResult(name=name, rung=name, role="rung", reason="", kind=kind, built_on=built_on, spec=StepSpec(4, 32),
                          precision="fp32", requirement={}, status="ok", saved_activation_bytes=saved,
                          predicted_activation_bytes=pred, process_base_bytes=base, process_peak_bytes=peak)

    eager = rec("eager", "speed", 16 * 2**20, 16 * 2**20, 300 * 2**20, 320 * 2**20, None)
    ckpt = rec("ckpt", "memory", 2 * 2**20, 2 * 2**20, 300 * 2**20, 310 * 2**20, "eager")
    assert eager.resident_rise == 20 * 2**20 and peak_cell(eager) == "20.0 MiB rss"
    assert short_bytes(2**30) == "1.00 GiB" and short_bytes(449796) == "439 KiB"
    assert bar_label(ckpt) == "act 2.00 MiB\n10.0 MiB rss"
    res = Results(schema="", status="complete", created="", command=[], config=resolved(memory=MemoryConfig(steps=2)),
                  environment=Environment(), model=SavedModel(), rungs=[eager, ckpt])
    line = next(n for n in memory_notes(res) if n.startswith("ckpt:"))
    assert "8.0× less" in line and "2.0× less" in line  # saved activations, and the resident rise


@pytest.mark.slow
def test_default_run_shows_saved_activations_and_a_measured_peak_for_eager_and_ckpt(tmp_path, capsys):
    """The acceptance on the tiny preset: both rungs carry both figures; ckpt's saving shows in file, table, plot."""
    # B=64 so that activations, not the allocator's small change, dominate the step's resident rise.
    rc = main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,ckpt", "--batch-size", "64",
               "--window-steps", "2", "--loss-steps", "4", "--learns-steps", "0", "--no-profile",
               "--out", str(tmp_path)])
    assert rc == 0
    (folder,) = [p for p in Path(tmp_path).iterdir() if p.is_dir()]
    res = {r["name"]: r for r in json.loads((folder / "results.json").read_text())["rungs"]}
    for name in ("eager", "ckpt"):
        r = res[name]
        assert r["saved_activation_bytes"] > 0 and r["predicted_activation_bytes"] == r["saved_activation_bytes"]
        assert r["process_peak_bytes"] > r["process_base_bytes"] > 0
    assert res["ckpt"]["saved_activation_bytes"] * 3 < res["eager"]["saved_activation_bytes"]
    rise = {n: res[n]["process_peak_bytes"] - res[n]["process_base_bytes"] for n in ("eager", "ckpt")}
    assert rise["ckpt"] < rise["eager"]
    out = capsys.readouterr().out
    assert short_bytes(res["ckpt"]["saved_activation_bytes"]) in out and "rss" in out
    assert (folder / "waterfall.png").stat().st_size > 0


def test_a_meter_that_fails_leaves_none_and_says_why(tiny, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the memory process exited with 1")

    monkeypatch.setattr(rung_memory, "peaks_in_child", broken)
    monkeypatch.setattr(rung_memory, "process_peak_unsupported", lambda: None)
    r = RungResult(name="eager", rung="eager", role="rung", reason="", kind="speed", built_on=None, spec=tiny.base_spec,
                   precision="fp32", requirement={}, status="ok")
    rung_memory.record(r, tiny, tiny.base_spec, tiny.step(tiny.base_spec), lambda msg: None)
    assert r.process_peak_bytes is None and r.resident_rise is None and peak_cell(r) == "n/a"
    assert r.saved_activation_bytes == r.predicted_activation_bytes > 0  # the other meters stand
    res = Results(schema="", status="complete", created="", command=[], config=resolved(), environment=Environment(), model=SavedModel(),
                  rungs=[r])
    assert any("exited with 1" in n for n in memory_notes(res))


def test_the_fp32_control_note_compares_the_resident_rise_on_a_cpu():
    from speedladder.measure.judging import Spread
    from speedladder.report.text import notes

    def rec(name: str, role: str, rise_mib: int, tokens: float) -> RungResult:
        return RungResult(name=name, rung="batch", role=role, reason="", kind="speed", built_on=None,
                          spec=StepSpec(64, 32), precision="bf16" if role == "rung" else "fp32", requirement={},
                          status="ok", tokens_per_s=Spread(tokens, tokens, tokens), process_base_bytes=100 * 2**20,
                          process_peak_bytes=(100 + rise_mib) * 2**20)

    res = Results(schema="", status="running", created="", command=[], config=resolved(), environment=Environment(), model=SavedModel(),
                  rungs=[rec("batch", "rung", 40, 30000.0), rec("batch-fp32", "control", 70, 15000.0)])
    line = next(n for n in notes(res) if "fp32 control" in n)
    assert "40.0 MiB vs 70.0 MiB" in line and "1.75×" in line
