"""The cost model's arithmetic against values computed by hand."""

from __future__ import annotations

import math

import pytest

from speedladder.models.gpt import GPT
from speedladder.models.presets import PRESETS
from speedladder.parallel import costmodel as cm


def test_gradient_bytes_of_the_d2l_model_are_the_source_texts_76_mb():
    n = GPT(PRESETS["d2l-512"].model).num_params()
    assert n == 19_009_536
    assert cm.grad_bytes(n) == 76_038_144  # 4 bytes a parameter: "~76 MB for the 19M model"


def test_ring_allreduce_time():
    # 100 MB over k=4 at busbw 10 GB/s: 2*3/4 * 100e6 / 10e9 = 15 ms, plus 10 µs latency.
    assert cm.t_allreduce(100e6, 4, 10e9, 10e-6) == pytest.approx(0.015 + 10e-6)
    # k=2: the ring factor is 1, so t = bytes / busbw.
    assert cm.t_allreduce(76e6, 2, 100e9, 0.0) == pytest.approx(0.76e-3)
    # Large k: 2(k-1)/k -> 2, the source text's t_comm ~ 2 * bytes / beta.
    assert cm.t_allreduce(1e9, 1000, 1e9, 0.0) == pytest.approx(2 * 999 / 1000)
    assert cm.t_allreduce(1e9, 1, 1e9, 1.0) == 0.0  # one process reduces nothing


def test_gather_time_and_bus_bandwidth():
    assert cm.t_gather(80e6, 2, 20e9, 0.0) == pytest.approx(0.002)  # (2-1)/2 * 80e6 / 20e9
    assert cm.t_gather(80e6, 4, 20e9, 5e-6) == pytest.approx(0.003 + 5e-6)  # 3/4 * 80e6 / 20e9
    # nccl-tests: 1 GB allreduced in 0.5 s over 8 ranks: algbw 2 GB/s, busbw 2 * 2*7/8 = 3.5 GB/s.
    assert cm.busbw_allreduce(10**9, 0.5, 8) == pytest.approx(3.5e9)


def test_ddp_buckets_follow_reverse_order_and_close_at_their_cap():
    # Reversed: 40 (< 50), +30 = 70 >= 50 closes the first bucket; then 20 + 10 = 30 is left over.
    assert cm.ddp_buckets([10, 20, 30, 40], bucket_cap=60, first_cap=50) == [70, 30]
    assert cm.ddp_buckets([30, 30, 30, 30], bucket_cap=60, first_cap=60) == [60, 60]
    assert cm.ddp_buckets([5], bucket_cap=60, first_cap=50) == [5]
    assert cm.ddp_buckets([], bucket_cap=60, first_cap=50) == []


def test_exposed_communication():
    assert cm.exposed(10.0, 2.0, 5.0) == 5.0  # 2 that cannot overlap + (10 - 2 - 5) that does not fit
    assert cm.exposed(10.0, 2.0, 20.0) == 2.0  # everything else hides under compute


def test_ddp_prediction_by_hand():
    # Two buckets of 60 bytes at busbw 60 B/s, k=2 (ring factor 1): 1 s each, 2 s in all.
    # 10 tokens a step at 10/3 tokens/s: t_compute 3 s, backward 2 s.
    p = cm.predict(2, "ddp", 10, 10 / 3, [30, 30, 30, 30], [], busbw=60.0, latency=0.0, bucket_cap=60,
                   first_cap=60, backward_fraction=2 / 3)
    assert p.t_compute_s == pytest.approx(3.0)
    assert p.t_comm_s == pytest.approx(2.0)
    assert p.t_exposed_s == pytest.approx(1.0)  # the last bucket; the first hides under the 2 s of backward
    assert p.floor_tokens_per_s == pytest.approx(2 * 10 / (3 + 2))
    assert p.overlap_tokens_per_s == pytest.approx(2 * 10 / (3 + 1))
    assert p.floor_efficiency == pytest.approx(0.6)
    assert p.overlap_efficiency == pytest.approx(0.75)
    assert (p.comm_bytes, p.messages) == (120, 2)


def test_the_source_texts_floor():
    # 76 MB of gradients, beta = 100 GB/s at k=2, 8192 tokens a step at 263k tokens/s, one bucket:
    # floor = 2 * 8192 / (8192 / 263000 + 76e6 / 100e9).
    p = cm.predict(2, "ddp", 8192, 263_000.0, [76_000_000], [], busbw=100e9, latency=0.0, bucket_cap=26_214_400,
                   first_cap=1 << 20, backward_fraction=2 / 3)
    assert p.floor_tokens_per_s == pytest.approx(2 * 8192 / (8192 / 263_000 + 76e6 / 100e9))
    assert p.overlap_tokens_per_s == pytest.approx(p.floor_tokens_per_s)  # one bucket cannot overlap
    assert cm.predict(1, "ddp", 8192, 263_000.0, [76_000_000], [], 100e9, 1e-3, 1, 1, 2 / 3).floor_tokens_per_s \
        == pytest.approx(263_000.0)  # k=1: nothing to communicate


def test_fsdp_prediction_by_hand():
    # Units root=40, blocks 20 and 20 bytes; k=2: each gather or scatter moves half the bytes; busbw 10 B/s.
    # forward gathers 2 + 1 + 1 = 4 s; backward gathers the blocks (1 + 1) and scatters all (2 + 1 + 1): 6 s.
    # compute 9 s: forward 3 s, backward 6 s. Exposed: forward 2 + max(0, 4 - 2 - 3) = 2;
    # backward (first gather 1 + last scatter 2) + max(0, 6 - 3 - 6) = 3. Total exposed 5 s.
    p = cm.predict(2, "fsdp", 9, 1.0, [], [40, 20, 20], busbw=10.0, latency=0.0, bucket_cap=1, first_cap=1,
                   backward_fraction=2 / 3)
    assert p.t_compute_s == pytest.approx(9.0)
    assert p.t_comm_s == pytest.approx(10.0)
    assert p.t_exposed_s == pytest.approx(5.0)
    assert p.floor_tokens_per_s == pytest.approx(2 * 9 / 19)
    assert p.overlap_tokens_per_s == pytest.approx(2 * 9 / 14)
    assert (p.comm_bytes, p.messages) == (3 * 80 - 40, 3 + 2 + 3)


def test_relative_error_and_bad_inputs():
    assert cm.relative_error(297_000, 253_000) == pytest.approx(44 / 253)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            cm.predict(2, "ddp", 1, 1.0, [4], [], bad, 0.0, 1, 1, 2 / 3)
    with pytest.raises(ValueError):
        cm.predict(0, "ddp", 1, 1.0, [4], [], 1.0, 0.0, 1, 1, 2 / 3)
    with pytest.raises(ValueError):
        cm.predict(2, "zero", 1, 1.0, [4], [], 1.0, 0.0, 1, 1, 2 / 3)


def test_datasheet_lookup_is_by_name():
    assert cm.datasheet_busbw_gbps("NVIDIA H200") == 450.0
    assert cm.datasheet_busbw_gbps("NVIDIA H100 PCIe") == 300.0
    assert cm.datasheet_busbw_gbps("AMD EPYC 7B13") is None
