"""Part 2: the model, its presets and their parameter counts."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from speedladder.models.gpt import GPT, GPTConfig
from speedladder.models.presets import PRESETS


def params(name: str) -> GPT:
    with torch.device("meta"):  # counts need no memory
        return GPT(PRESETS[name].model)


def test_gpt2_124m_has_nanogpts_parameter_count():
    m = params("gpt2-124m")
    assert m.num_params() == 124_439_808  # position embeddings included, tied head counted once
    assert m.matmul_params() == 124_439_808 - 1024 * 768  # the position table does no arithmetic
    assert m.lm_head.weight is m.wte.weight


def test_d2l_512_is_about_19m_parameters():
    m = params("d2l-512")
    cfg = m.cfg
    assert (cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.mlp_hidden, cfg.block_size, cfg.vocab_size) == \
        (512, 8, 6, 2048, 128, 28)
    assert m.num_params() == 19_009_536
    # Untied: the token table is a lookup, the head is a matmul.
    assert m.matmul_params() == 19_009_536 - 28 * 512 - 128 * 512
    assert m.lm_head.weight is not m.wte.weight


def test_other_presets_counts():
    assert params("d2l-256").num_params() == 4_786_176
    assert params("d2l-cpu").num_params() == 412_160
    assert params("tiny").num_params() == 19_968


def test_forward_shapes_and_initial_loss_is_uniform_guess():
    torch.manual_seed(0)
    cfg = PRESETS["tiny"].model
    m = GPT(cfg)
    idx = torch.randint(cfg.vocab_size, (3, 16))
    logits, loss = m(idx, idx)
    assert logits.shape == (3, 16, cfg.vocab_size)
    # Small initial weights give near-uniform predictions: loss close to ln(V).
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), abs=0.05)
    assert m(idx)[1] is None


def test_attention_is_causal():
    torch.manual_seed(0)
    m = GPT(PRESETS["tiny"].model).eval()
    idx = torch.randint(28, (1, 20))
    changed = idx.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % 28
    a, _ = m(idx)
    b, _ = m(changed)
    torch.testing.assert_close(a[0, :12], b[0, :12])  # the past cannot see the future
    assert not torch.allclose(a[0, 12:], b[0, 12:])


def test_attention_is_written_by_hand():
    """Fused attention is a later rung: the reference model must not call it."""
    calls = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    m = GPT(PRESETS["tiny"].model)
    with Spy():
        m(torch.randint(28, (2, 8)))
    assert F.scaled_dot_product_attention not in calls
    assert F.softmax in calls


def test_sequence_longer_than_context_is_refused():
    m = GPT(PRESETS["tiny"].model)
    with pytest.raises(ValueError, match="exceeds block_size"):
        m(torch.zeros(1, PRESETS["tiny"].model.block_size + 1, dtype=torch.long))


def test_config_checks_its_values():
    with pytest.raises(ValueError, match="divisible"):
        dataclasses.replace(PRESETS["tiny"].model, n_head=3)
    with pytest.raises(ValueError, match="positive"):
        GPTConfig(vocab_size=0, block_size=8, n_layer=1, n_head=1, n_embd=8, mlp_hidden=8)
