"""The ladder beyond: sdpa, fused-adamw, pad-vocab, max-autotune, cudagraphs, muon, fp8 — transforms and gates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedladder.config.ladders import FULL_LADDER
from speedladder.config.presets import PRESETS
from speedladder.gpt import GPT
from speedladder.progress import Progress
from speedladder.rungs import RUNGS, Env, PaddedHead, SDPAttention, StepSpec, compose, pad_vocab, padded_vocab, use_sdpa
from speedladder.rungs.optim import Muon, MuonAdamW, orthogonalize
from speedladder.step import TrainStep
from speedladder.verify import curves
from speedladder.verify.gates import Gates

CPU = Env("cpu", None, batch_multiplier=4)
H100 = Env("cuda", (9, 0), batch_multiplier=4)
A100 = Env("cuda", (8, 0), batch_multiplier=4)


@pytest.fixture(scope="module")
def gates(tiny):
    return Gates(tiny, Progress(quiet=True))


@pytest.fixture(scope="module")
def ref(tiny, gates):
    """Eager fp32 at the tiny shape: the reference every new rung's gate is checked against."""
    return gates.reference(tiny.base_spec)


def equivalence(gates, step, ref):
    """The rung's equivalence check, as its gate records it."""
    return gates.check(step, ref, ref.probe, "eager", lambda m: None)[0].equivalence


def test_full_ladder_specs_on_a_gpu():
    spec, seen = StepSpec(16, 1024), {}
    for name in FULL_LADDER:
        spec = RUNGS[name].transform(spec, H100)
        seen[name] = spec
    top = seen["fp8"]
    assert top.compile and top.compile_mode == "max-autotune" and top.cudagraphs
    assert top.autocast == "bf16" and top.tf32 and top.optimizer == "adamw-fused"
    assert top.transforms == ("sdpa", "pad-vocab", "float8") and top.precision == "fp8"
    assert top.batch_size == 64
    assert not seen["batch"].cudagraphs and seen["batch"].precision == "bf16"
    assert RUNGS["cudagraphs"].transform(StepSpec(1, 1), H100).compile_mode == "reduce-overhead"


def test_cuda_only_rungs_say_why_they_are_skipped_on_a_cpu(monkeypatch):
    for name in ("max-autotune", "cudagraphs", "fp8"):
        assert RUNGS[name].requires.unmet(CPU) == "needs cuda; this device is cpu"
    assert RUNGS["fp8"].requires.unmet(A100) == "needs CUDA compute capability >= 8.9; this GPU is 8.0"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # torchao (and Triton) absent
    assert RUNGS["fp8"].requires.unmet(H100) == "needs torchao, not installed: pip install speedladder[fp8]"
    for name in ("sdpa", "fused-adamw", "pad-vocab", "muon"):
        assert RUNGS[name].requires.unmet(CPU) is None


def test_sdpa_keeps_every_parameter_and_computes_the_same_function():
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"].model)
    before = dict(model.named_parameters())
    idx = torch.randint(28, (4, 32))
    logits, _ = model(idx, idx)
    fused = use_sdpa(model)
    assert all(isinstance(b.attn, SDPAttention) for b in fused.blocks)
    assert {n: id(p) for n, p in fused.named_parameters()} == {n: id(p) for n, p in before.items()}
    logits2, _ = fused(idx, idx)
    torch.testing.assert_close(logits2, logits, rtol=1e-5, atol=1e-6)  # fp32: reordered sums only


@pytest.mark.parametrize("vocab, tied", [(28, False), (50257, True)])
def test_padded_vocabulary_gives_the_same_loss_and_logits(vocab, tied):
    assert padded_vocab(50257) == 50304 and padded_vocab(28) == 64 and padded_vocab(64) == 64
    torch.manual_seed(0)
    cfg = dataclasses.replace(PRESETS["tiny"].model, vocab_size=vocab, tie_embeddings=tied)
    plain = GPT(cfg)
    padded = GPT(cfg)
    padded.load_state_dict(plain.state_dict())
    params = dict(padded.named_parameters())
    pad_vocab(padded)
    assert isinstance(padded.lm_head, PaddedHead)
    assert padded.lm_head.weight.shape == (padded_vocab(vocab), 32) == padded.wte.weight.shape
    assert {n: id(p) for n, p in padded.named_parameters()} == {n: id(p) for n, p in params.items()}
    idx = torch.randint(vocab, (2, 32))
    logits, loss = plain(idx, idx)
    logits_p, loss_p = padded(idx, idx)
    assert logits_p.shape[-1] == padded_vocab(vocab)
    torch.testing.assert_close(logits_p[..., :vocab], logits, rtol=1e-6, atol=1e-6)
    assert torch.isneginf(logits_p[..., vocab:]).all()  # the padding gets no probability
    torch.testing.assert_close(loss_p, loss, rtol=1e-6, atol=0.0)
    loss.backward()
    loss_p.backward()
    g = padded.lm_head.weight.grad
    torch.testing.assert_close(g[:vocab], plain.lm_head.weight.grad, rtol=1e-5, atol=1e-7)
    assert not g[vocab:].any()  # nothing flows into the padding rows


@pytest.mark.parametrize("names", [("sdpa",), ("fused-adamw",), ("pad-vocab",), ("sdpa", "fused-adamw", "pad-vocab")])
def test_new_rungs_pass_their_gates_against_eager_fp32(tiny, gates, ref, names):
    spec = compose(names, tiny.base_spec, tiny.env)
    step = TrainStep(spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    eq = equivalence(gates, step, ref)
    assert eq.passed, eq.detail
    assert eq.precision == "fp32" and eq.logits_rel_err < 1e-5
    band = curves.loss_band(curves.loss_curve(step, ref.batches), ref.curve, 0.02)
    assert band.passed and band.max_rel_diff < 1e-5  # the same update rule: the same curve
    if "pad-vocab" in names:
        # Reset and gradients map the padded parameters back to the reference names and shapes.
        assert step.params["wte.weight"].shape[0] == 64
        assert {n: t.shape for n, t in step.reference_state().items()} == {n: t.shape for n, t in tiny.init.items()}
        step.reset()
        assert all(torch.equal(step.reference_state()[n], tiny.init[n]) for n in tiny.init)
        assert not step.params["wte.weight"][28:].any()


def test_fused_adamw_is_fused_on_cpu_and_cuda_foreach_elsewhere(tiny):
    assert RUNGS["fused-adamw"].transform(tiny.base_spec, CPU).optimizer == "adamw-fused"
    assert RUNGS["fused-adamw"].transform(tiny.base_spec, H100).optimizer == "adamw-fused"
    assert RUNGS["fused-adamw"].transform(tiny.base_spec, Env("mps", None, 4)).optimizer == "adamw-foreach"
    step = TrainStep(compose(("fused-adamw",), tiny.base_spec, tiny.env), tiny.cfg.model, tiny.init, tiny.device,
                     tiny.cfg.run.lr)
    assert step.optimizer.defaults["fused"] is True and step.optimizer.defaults["lr"] == tiny.cfg.run.lr


def test_a_gate_catches_a_padded_head_that_leaks_probability(tiny, gates, ref, monkeypatch):
    """The padded-vocabulary gate can fail: unmasked padding rows change the softmax."""
    monkeypatch.setattr(PaddedHead, "forward", lambda self, x: torch.nn.functional.linear(x, self.weight))
    step = TrainStep(compose(("pad-vocab",), tiny.base_spec, tiny.env), tiny.cfg.model, tiny.init, tiny.device,
                     tiny.cfg.run.lr)
    eq = equivalence(gates, step, ref)
    assert not eq.passed and "loss" in eq.detail


def test_muon_orthogonalizes_its_update():
    torch.manual_seed(0)
    for shape in ((64, 256), (256, 64)):
        # A gradient with singular values spread over a factor of 20: U diag(s) V^T.
        u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
        v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
        g = u @ torch.diag(torch.logspace(-1.3, 0, min(shape))) @ v.T
        s_in = torch.linalg.svdvals(g)
        assert s_in.max() / s_in.min() > 19  # a spread-out gradient ...
        s = torch.linalg.svdvals(orthogonalize(g, steps=5))
        assert s.min() > 0.6 and s.max() < 1.2, (s.min(), s.max())  # ... whose update has singular values near 1


def test_muon_updates_hidden_matrices_and_leaves_the_rest_to_adamw(tiny):
    step = TrainStep(compose(("muon",), tiny.base_spec, tiny.env), tiny.cfg.model, tiny.init, tiny.device,
                     tiny.cfg.run.lr)
    assert isinstance(step.optimizer, MuonAdamW)
    muon_params = {id(p) for g in step.optimizer.muon.param_groups for p in g["params"]}
    names = sorted(n for n, p in step.params.items() if id(p) in muon_params)
    assert names == sorted(f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc",
                                                                                  "mlp.proj"))
    adamw = {id(p) for g in step.optimizer.adamw.param_groups for p in g["params"]}
    assert adamw | muon_params == {id(p) for p in step.params.values()} and not adamw & muon_params
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.zeros(3))], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    # One Muon step on a matrix moves it by lr * sqrt(max(1, rows/cols)) times a near-orthogonal matrix.
    p = torch.nn.Parameter(torch.zeros(96, 32))
    p.grad = torch.randn(96, 32)
    Muon([p], lr=0.1, momentum=0.0, nesterov=False, ns_steps=5).step()
    s = torch.linalg.svdvals(p.detach() / (0.1 * 3 ** 0.5))
    assert s.min() > 0.6 and s.max() < 1.2


def test_muon_gate_has_no_loss_band_but_a_tokens_to_target_comparison(tiny, gates, ref):
    spec = compose(("muon",), tiny.base_spec, tiny.env)
    assert not spec.same_update and compose(("fused-adamw",), tiny.base_spec, tiny.env).same_update
    step = TrainStep(spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    assert equivalence(gates, step, ref).passed  # same weights, same batch: the same forward and backward
    band = curves.no_loss_band(spec)
    assert not band.applies and band.passed and "not applicable" in band.detail
    adamw = TrainStep(tiny.base_spec, tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)
    t = curves.tokens_to_target(step, adamw, ref.batches)
    assert t.steps == 20 and t.window == 2 and len(t.losses) == len(t.adamw_losses) == 20
    assert t.adamw_losses == pytest.approx(ref.curve, rel=1e-6)  # AdamW over the same batches: eager's curve
    assert t.target_loss == pytest.approx(sum(ref.curve[-2:]) / 2)
    assert t.adamw_tokens is not None and t.adamw_tokens <= 20 * 128
    assert t.passed == (t.tokens is not None and t.tokens <= t.adamw_tokens)


def test_tokens_to_a_target_loss():
    assert curves.tokens_to([4.0, 3.0, 2.0, 1.0], 2.5, 2, 10) == 30  # mean(3, 2) first <= 2.5 at step 3
    assert curves.tokens_to([4.0, 3.0], 1.0, 1, 10) is None
    assert curves.tokens_to([1.0], 1.0, 1, 7) == 7


def test_fp8_transform_converts_the_block_linears_only(monkeypatch):
    """torchao is absent here: a stand-in records which modules the transform hands it."""
    import sys
    import types

    from speedladder.rungs import MODEL_TRANSFORMS

    chosen, recipes = [], []

    def convert(model, config, module_filter_fn):
        chosen.extend(name for name, m in model.named_modules() if module_filter_fn(m, name))
        return model

    class Config:
        @staticmethod
        def from_recipe_name(name):
            recipes.append(name)
            return Config()

    fake = types.ModuleType("torchao.float8")
    fake.convert_to_float8_training = convert
    fake.Float8LinearConfig = Config
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    cfg = dataclasses.replace(PRESETS["tiny"].model, n_layer=1, n_embd=32, mlp_hidden=48)
    MODEL_TRANSFORMS["float8"](GPT(cfg))
    # Both dimensions divisible by 16; the head is left in bf16.
    assert sorted(chosen) == ["blocks.0.attn.proj", "blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.0.mlp.proj"]
    assert recipes == ["rowwise"]  # per-row scales: a token's scale is its own (causal)
    chosen.clear()
    MODEL_TRANSFORMS["float8"](GPT(dataclasses.replace(cfg, mlp_hidden=40)))
    assert sorted(chosen) == ["blocks.0.attn.proj", "blocks.0.attn.qkv"]  # 40 is not a multiple of 16


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon arrived in torch 2.9")
@pytest.mark.parametrize("shape", [(64, 96), (96, 64)])
def test_our_muon_fallback_matches_torchs_muon(shape):
    """The fallback (for torch < 2.9) and torch.optim.Muon, which the muon rung uses here, make the same updates."""
    from speedladder.rungs.optim import NS_COEFFICIENTS

    torch.manual_seed(0)
    start = torch.randn(shape)
    ours_p, torch_p = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours = Muon([ours_p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    theirs = torch.optim.Muon([torch_p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5,
                              ns_coefficients=NS_COEFFICIENTS, weight_decay=0.0)
    for _ in range(4):
        g = torch.randn(shape)
        ours_p.grad, torch_p.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    moved_ours, moved_torch = ours_p.detach() - start, torch_p.detach() - start
    # torch orthogonalizes in bf16 (8-bit mantissa), ours in fp32 on a CPU: equal to bf16's precision.
    rel = float((moved_ours - moved_torch).norm() / moved_torch.norm())
    assert rel < 0.05, rel
    # And the comparison can fail: without Nesterov momentum the same gradients move the weights elsewhere.
    other = torch.nn.Parameter(start.clone())
    plain = Muon([other], lr=0.02, momentum=0.95, nesterov=False, ns_steps=5)
    torch.manual_seed(0)
    torch.randn(shape)
    for _ in range(4):
        other.grad = torch.randn(shape)
        plain.step()
    assert float((other.detach() - start - moved_torch).norm() / moved_torch.norm()) > 0.05


def test_the_fp8_rungs_mfu_is_taken_against_the_peak_blended_by_its_flop_share(tmp_path):
    """The ladder's MFU peak for an fp8 rung: fp8's for the block linears it converted, bf16's for the rest; any
    other rung keeps its precision's peak (GPT-2's shapes, the H200's datasheet peaks given as --peak-tflops)."""
    from speedladder.climbing.ladder import Ladder
    from speedladder.config.run import RunConfig
    from speedladder.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu", peak_tflops={"fp8": 1978.9, "bf16": 989.4}))
    ladder = Ladder(work, tmp_path)
    with torch.device("meta"):
        gpt2 = GPT(PRESETS["gpt2-124m"].model)
    fpt = 855_166_464  # GPT-2 at T=1024: 6N + 12LHQT
    bf16 = StepSpec(16, 1024, autocast="bf16")
    peak, basis = ladder.flop_peaks.of(dataclasses.replace(bf16, transforms=("float8",)), gpt2, fpt)
    assert peak == pytest.approx(1409.35, abs=0.01)  # test_measure.py works the blend out by hand
    assert "60% of the FLOPs" in basis and "bf16's for the rest" in basis
    assert "both the peak given by --peak-tflops" in basis
    assert ladder.flop_peaks.of(bf16, gpt2, fpt) == (989.4, "peak given by --peak-tflops")


@pytest.mark.parametrize("hardware, env, native, why", [
    ((False, False), {}, False, "no AVX-512 BF16 or AMX (AVX2): bf16 is emulated in fp32"),  # a real AVX2 processor
    ((True, False), {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False, "ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN below AVX-512 BF16"),
    ((True, True), {"ATEN_CPU_CAPABILITY": "avx2"}, False, "ATEN_CPU_CAPABILITY keeps torch at AVX2"),
    ((True, True), {}, True, "AVX-512 BF16 or AMX: bf16 matmuls run natively"),
    ((None, None), {}, None, "cannot tell"),
])
def test_the_processor_names_why_bf16_is_emulated_whatever_caused_it(monkeypatch, hardware, env, native, why):
    """What the processor has and what the environment caps, read from stand-ins for torch's probes: each cause on
    any processor, so the wording of one is not tested only where it happens to hold."""
    from speedladder.measure import processor

    bf16, amx = hardware
    monkeypatch.setattr(processor, "_probe", lambda name: bf16 if "bf16" in name else amx)
    capability = "AVX2" if not bf16 or "ATEN_CPU_CAPABILITY" in env else "AVX512"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cpu = processor.cpu()
    assert cpu.bf16_native is native and why in cpu.why, cpu
    assert native is not False or "emulated" in cpu.why or "no bf16 kernels" in cpu.why


@pytest.mark.isa
def test_muon_iterates_in_bf16_only_where_bf16_is_native(monkeypatch):
    """torch.optim.Muon always iterates in bf16; on a CPU whose oneDNN is capped below AVX-512 BF16 (as on an AVX2
    processor) bf16 is emulated, so the rung takes our Muon in fp32, and results.json says which it took."""
    from speedladder import results
    from speedladder.measure import processor
    from speedladder.rungs.optim import muon_optimizer, ns_dtype_for

    p = torch.nn.Parameter(torch.randn(8, 8))
    # Capped here, or an AVX2 processor of its own: either way bf16 is not native, and the reason says it is emulated
    # (the wording of each cause: test_the_processor_names_why_bf16_is_emulated_whatever_caused_it).
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert processor.cpu().bf16_native is False and "emulated" in processor.cpu().why
    assert ns_dtype_for(torch.device('cpu'))[0] == torch.float32
    opt = muon_optimizer([p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    assert type(opt) is Muon and opt.ns_dtype == torch.float32
    env = results.environment(torch.device('cpu'))
    assert env.bf16_native is False and "fp32" in (env.muon or "")
    monkeypatch.setattr(processor, "bf16_native", lambda device: True)  # a processor with AVX-512 BF16 or AMX
    assert ns_dtype_for(torch.device('cpu'))[0] == torch.bfloat16
    opt = muon_optimizer([p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    assert (type(opt) is torch.optim.Muon) if hasattr(torch.optim, "Muon") else opt.ns_dtype == torch.bfloat16
