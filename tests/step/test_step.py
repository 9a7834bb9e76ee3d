"""Part 4: the training step — AdamW at lr 1e-3, grads set to None, cross-entropy, no host sync."""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speedladder.data.batches import BatchStream
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep, initial_state, matmul_precision


def test_step_uses_adamw_at_the_sources_learning_rate(tiny):
    step = TrainStep(tiny.base_spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    assert type(step.optimizer) is torch.optim.AdamW
    assert step.optimizer.defaults["lr"] == 1e-3 == tiny.cfg.run.lr


def test_step_updates_weights_and_sets_grads_to_none(tiny):
    step = TrainStep(tiny.base_spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    stream = BatchStream(tiny.corpus, tiny.cfg.batch_size, tiny.cfg.seq_len, tiny.device, 0)
    before = {n: p.detach().clone() for n, p in step.params.items()}
    loss = step(*next(stream))
    assert loss.ndim == 0 and not loss.requires_grad
    # Cross-entropy over the vocabulary, from near-uniform initial predictions.
    assert float(loss) == __import__("pytest").approx(math.log(tiny.cfg.model.vocab_size), abs=0.05)
    assert all(p.grad is None for p in step.params.values())  # zero_grad(set_to_none=True)
    assert all(not torch.equal(before[n], p) for n, p in step.params.items())


def test_reset_restores_the_initial_weights(tiny):
    step = TrainStep(tiny.base_spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    stream = BatchStream(tiny.corpus, tiny.cfg.batch_size, tiny.cfg.seq_len, tiny.device, 0)
    for _ in range(3):
        step(*next(stream))
    step.reset()
    for name, p in step.params.items():
        assert torch.equal(p.detach(), tiny.init[name])
    assert not step.optimizer.state  # a fresh optimizer


def test_initial_state_is_seeded(tiny):
    a = initial_state(tiny.cfg.model, seed=5)
    b = initial_state(tiny.cfg.model, seed=5)
    c = initial_state(tiny.cfg.model, seed=6)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["wte.weight"], c["wte.weight"])


def test_a_timed_step_never_reads_a_value_back_to_the_host(tiny):
    """docs/measurement.md, rule 3: no .item() or other host sync inside the step.

    AdamW reads its step counter with .item(), but that counter is a host
    tensor by design (not capturable, not fused), so reading it waits for
    nothing; every other read-back would wait for the device.
    """
    seen, read_back = [], []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            if func is torch.ops.aten._local_scalar_dense.default:  # what .item() dispatches to
                read_back.append(args[0])
            return func(*args, **(kwargs or {}))

    for spec in (tiny.base_spec, StepSpec(4, 32, autocast="bf16", transforms=("activation-checkpointing",)),
                 StepSpec(4, 32, transforms=("sdpa", "pad-vocab"), optimizer="adamw-fused"),
                 StepSpec(4, 32, optimizer="muon")):
        step = TrainStep(spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
        stream = BatchStream(tiny.corpus, spec.batch_size, spec.seq_len, tiny.device, 0)
        step(*next(stream))  # AdamW's first step creates its state: not what is timed
        seen.clear()
        read_back.clear()
        with Spy():
            for _ in range(2):
                step(*next(stream))
        assert seen, "the spy saw no operations"
        counters = [st["step"] for st in step.optimizer.state.values() if "step" in st]  # Muon's have none
        assert all(any(t is c for c in counters) for t in read_back), "a step read a computed value back"


def test_tf32_is_set_for_the_rung_and_restored():
    before = torch.get_float32_matmul_precision()
    with matmul_precision(StepSpec(1, 1, tf32=True)):
        assert torch.get_float32_matmul_precision() == "high"
    with matmul_precision(StepSpec(1, 1)):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before
