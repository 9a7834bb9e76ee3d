"""What the gates run a step on (verify/probes.py): the probe weights, a step's outputs copied to the host in one
transfer, and the causality probe's floor from the rung's Tolerance."""

from __future__ import annotations

import dataclasses

import torch

from speedladder.verify import probes
from speedladder.verify.tolerance import TOLERANCES


def test_the_probe_weights_scale_matrices_and_keep_vectors():
    w = {"m": torch.ones(2, 3), "b": torch.ones(3)}
    at = probes.amplified(w)
    assert torch.equal(at["m"], w["m"] * probes.PROBE_AMPLIFY) and torch.equal(at["b"], w["b"])


def test_gradients_come_to_the_host_in_one_flat_buffer_named_as_they_were():
    grads = {"a": torch.randn(3, 4), "b": torch.randn(5), "c": torch.randn(2, 2, 2)}
    host = probes.host_copy(grads, torch.float64)
    assert list(host) == list(grads)
    for n, g in grads.items():
        assert host[n].dtype == torch.float64 and host[n].shape == g.shape and torch.equal(host[n], g.double())
    storages = {t.untyped_storage().data_ptr() for t in host.values()}
    assert len(storages) == 1  # one buffer: one copy, one sync on a device
    assert probes.host_copy({}, torch.float32) == {}


def test_the_causality_probe_allows_the_rungs_precision_its_floor_and_sees_a_leak(tiny):
    batch = tiny.gate_batches(tiny.base_spec, 1)[0]
    at = probes.amplified(tiny.init)
    fp32 = probes.causality(tiny.step(tiny.base_spec), at, batch, 2, tiny.cfg.model.vocab_size)
    bf16 = probes.causality(tiny.step(dataclasses.replace(tiny.base_spec, autocast="bf16")), at, batch, 2,
                            tiny.cfg.model.vocab_size)
    assert fp32.passed and bf16.passed and fp32.past_max_abs == 0.0 and fp32.future_max_abs > 0
    rms32 = fp32.allowed / TOLERANCES["fp32"].causal_floor
    assert bf16.allowed >= TOLERANCES["bf16"].causal_floor * rms32 * 0.5  # bf16's floor, 100x fp32's
