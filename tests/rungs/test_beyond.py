"""The ladder beyond: sdpa, fused-adamw, pad-vocab, max-autotune, cudagraphs, muon, fp8 — transforms and gates."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from conftest import Described

from speedladder.config.ladders import FULL_LADDER
from speedladder.models.gpt import GPT, GPTConfig
from speedladder.models.presets import PRESETS
from speedladder.progress import Progress
from speedladder.rungs import (
    RUNGS,
    Capability,
    Env,
    PaddedHead,
    SDPAttention,
    compose,
    pad_vocab,
    padded_vocab,
    use_sdpa,
)
from speedladder.spec import StepSpec
from speedladder.step.muon import Muon, MuonAdamW, orthogonalize
from speedladder.step.train_step import TrainStep
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
    for name in ("max-autotune", "cudagraphs", "fp8", "fp8-tensorwise"):
        assert RUNGS[name].requires.unmet(CPU) == "needs cuda; this device is cpu"
    for name in ("fp8", "fp8-tensorwise"):
        assert RUNGS[name].requires.unmet(A100) == "needs CUDA compute capability >= 8.9; this GPU is 8.0"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # torchao (and Triton) absent
    with_shapes = dataclasses.replace(H100, model=Described(shapes=PRESETS["d2l-512"].model))
    for env in (H100, with_shapes):  # without torchao its filter says nothing: the package is what is missing
        assert RUNGS["fp8"].requires.unmet(env) == "needs torchao, not installed: pip install speedladder[fp8]"
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


def _wide(**shape) -> GPTConfig:
    """GPT-2 124M's block with other widths: GPT-2 XL's by default (1600 wide, 25 heads, MLP 6400)."""
    return dataclasses.replace(PRESETS["gpt2-124m"].model, **{"n_embd": 1600, "n_head": 25, "mlp_hidden": 6400,
                                                              **shape})


@pytest.mark.parametrize("recipe, preset, kept", [
    # N x K (outputs x inputs) of qkv, attn.proj, mlp.fc, mlp.proj: d2l-512 1536x512, 512x512, 2048x512, 512x2048;
    # GPT-2 124M 2304x768, 768x768, 3072x768, 768x3072; GPT-2 XL's widths 4800x1600, 1600x1600, 6400x1600,
    # 1600x6400. Rowwise keeps N > 2048 and K > 1024 unless N <= 4096 and K <= 2048; tensorwise N > 1024 or K > 4096.
    ("rowwise", "d2l-512", []),
    ("rowwise", "gpt2-124m", []),
    ("rowwise", "wide", ["attn.qkv", "mlp.fc"]),
    ("tensorwise", "d2l-512", ["attn.qkv", "mlp.fc"]),
    ("tensorwise", "gpt2-124m", ["attn.qkv", "mlp.fc"]),
    ("tensorwise", "wide", ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]),
])
def test_the_fp8_rungs_convert_the_block_linears_torchaos_filter_keeps(recipe, preset, kept):
    """torchao's own filter for each recipe decides, on the meta device (nothing allocated): the fp8 rungs convert
    the block Linears it keeps and never the head."""
    pytest.importorskip("torchao.float8")
    from speedladder.rungs import RungError, float8_linears

    cfg = _wide() if preset == "wide" else PRESETS[preset].model
    with torch.device("meta"):
        model = GPT(dataclasses.replace(cfg, n_layer=2))
    if not kept:
        with pytest.raises(RungError, match=f"no block Linear qualifies for torchao's {recipe} filter"):
            float8_linears(model, recipe=recipe)
        return
    converted = float8_linears(model, recipe=recipe)
    fp8 = sorted(n for n, m in converted.named_modules() if type(m).__name__ == "Float8Linear")
    assert fp8 == sorted(f"blocks.{i}.{name}" for i in range(2) for name in kept)
    assert type(converted.lm_head).__name__ == "Linear"  # the head stays in bf16


def test_an_fp8_rung_no_block_linear_qualifies_for_is_skipped_with_the_shapes_before_anything_is_built(monkeypatch):
    """The rung's requirement reads the model's shapes: at d2l-512 and GPT-2 124M torchao's rowwise filter keeps no
    block Linear, so the rung is skipped, the shapes and the rule named, before a model is built; at GPT-2 XL's
    widths it runs. The tensorwise rung keeps qkv and the MLP's first Linear at both presets."""
    pytest.importorskip("torchao.float8")

    def on(cfg: GPTConfig) -> Env:
        return dataclasses.replace(H100, model=Described(shapes=cfg))

    find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name == "triton" else find_spec(name))
    built = []
    monkeypatch.setattr(GPT, "__init__", lambda *a, **k: built.append(a))  # a whole model is never built
    d2l = RUNGS["fp8"].requires.unmet(on(PRESETS["d2l-512"].model))
    assert d2l == ("not applicable to this model: no block Linear qualifies for torchao's rowwise filter (N x K, "
                   "kept where N > 2048 and K > 1024, and not both N <= 4096 and K <= 2048): attn.qkv 1536x512, "
                   "attn.proj 512x512, mlp.fc 2048x512, mlp.proj 512x2048")
    gpt2 = RUNGS["fp8"].requires.unmet(on(PRESETS["gpt2-124m"].model))
    assert gpt2 is not None and gpt2.endswith("attn.qkv 2304x768, attn.proj 768x768, mlp.fc 3072x768, "
                                               "mlp.proj 768x3072")
    assert RUNGS["fp8"].requires.unmet(on(_wide())) is None
    assert RUNGS["fp8-tensorwise"].requires.unmet(on(PRESETS["d2l-512"].model)) is None
    assert RUNGS["fp8-tensorwise"].requires.unmet(on(PRESETS["gpt2-124m"].model)) is None
    assert "tensorwise filter (N x K, kept where N > 1024 or K > 4096)" in RUNGS["fp8-tensorwise"].requires.unmet(
        on(_wide(n_embd=256, n_head=4, mlp_hidden=1024)))  # 768x256 at most
    assert not built
    assert RUNGS["fp8"].requires.to_dict()["shape"] == "torchao's rowwise filter"  # what results.json records


def test_the_fp8_rungs_compile_and_keep_their_base_mode():
    """torchao's float8 needs torch.compile to fuse its scaling and casts: each fp8 rung switches compile on over
    an eager base, and keeps a compiled base's mode."""
    bf16 = StepSpec(64, 128, autocast="bf16", tf32=True)
    for name, cap, recipe in (("fp8", Capability.FLOAT8, "rowwise"),
                              ("fp8-tensorwise", Capability.FLOAT8_TENSORWISE, "tensorwise")):
        spec = RUNGS[name].transform(bf16, H100)
        assert spec.compile and spec.compile_mode is None and spec.transforms == (cap,)
        assert spec.precision == "fp8" and spec.float8_recipe == recipe
        graphs = RUNGS[name].transform(dataclasses.replace(bf16, compile=True, compile_mode="reduce-overhead"), H100)
        assert graphs.compile and graphs.compile_mode == "reduce-overhead"
    assert bf16.float8_recipe is None and bf16.precision == "bf16"


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon arrived in torch 2.9")
@pytest.mark.parametrize("shape", [(64, 96), (96, 64)])
def test_our_muon_fallback_matches_torchs_muon(shape):
    """The fallback (for torch < 2.9) and torch.optim.Muon, which the muon rung uses here, make the same updates."""
    from speedladder.step.muon import NS_COEFFICIENTS

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
    other rung keeps its precision's peak (GPT-2's shapes, the H200's datasheet peaks given as --peak-tflops). At
    GPT-2 124M the tensorwise recipe converts qkv and the MLP's first Linear in each block: 6 x 12 x (768 x 2304 +
    768 x 3072) = 297,271,296 of its 855,166,464 FLOPs a token (35%)."""
    pytest.importorskip("torchao.float8")
    from speedladder.config.run import RunConfig
    from speedladder.ladder.climb import Ladder
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu", peak_tflops={"fp8": 1978.9, "bf16": 989.4}))
    ladder = Ladder(work, tmp_path)
    with torch.device("meta"):
        gpt2 = GPT(PRESETS["gpt2-124m"].model)
    fpt = 855_166_464  # GPT-2 at T=1024: 6N + 12LHQT
    bf16 = StepSpec(16, 1024, autocast="bf16")
    tensorwise = dataclasses.replace(bf16, transforms=(Capability.FLOAT8_TENSORWISE,))
    peak, basis = ladder.flop_peaks.of(tensorwise, gpt2, fpt)
    # 855,166,464 / (297,271,296 / 1978.9 + 557,895,168 / 989.4) = 1197.56 TFLOP/s
    assert peak == pytest.approx(1197.56, abs=0.01)
    assert "35% of the FLOPs" in basis and "bf16's for the rest" in basis
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
    from speedladder import processor

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
    from speedladder import processor
    from speedladder.records import storage
    from speedladder.step.muon import muon_optimizer

    p = torch.nn.Parameter(torch.randn(8, 8))
    # Capped here, or an AVX2 processor of its own: either way bf16 is not native, and the reason says it is emulated
    # (the wording of each cause: test_the_processor_names_why_bf16_is_emulated_whatever_caused_it).
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert processor.cpu().bf16_native is False and "emulated" in processor.cpu().why
    assert processor.ns_dtype_for(torch.device('cpu'))[0] == torch.float32
    opt = muon_optimizer([p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    assert type(opt) is Muon and opt.ns_dtype == torch.float32
    env = storage.environment(torch.device('cpu'))
    assert env.bf16_native is False and "fp32" in (env.muon or "")
    monkeypatch.setattr(processor, "bf16_native", lambda device: True)  # a processor with AVX-512 BF16 or AMX
    assert processor.ns_dtype_for(torch.device('cpu'))[0] == torch.bfloat16
    opt = muon_optimizer([p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5)
    assert (type(opt) is torch.optim.Muon) if hasattr(torch.optim, "Muon") else opt.ns_dtype == torch.bfloat16


def test_the_tensorwise_rung_is_judged_on_its_own_recipes_scale_and_fails_causality(tiny, monkeypatch, fp8_any_size):
    """fp8-tensorwise after bf16, through torchao's emulation: the gates emulate its recipe (one scale a tensor, the
    output's gradient in e5m2) for the scale it is judged on, so its distance from fp64 passes; one amax over the
    whole batch sees the future tokens, and the causality probe fails it."""
    pytest.importorskip("torchao.float8")
    import functools

    from conftest import plant

    from speedladder.progress import Progress
    from speedladder.rungs import float8_linears
    from speedladder.verify.gates import Gates

    plant(monkeypatch, Capability.FLOAT8_TENSORWISE,
          functools.partial(float8_linears, recipe="tensorwise", emulate=True))
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    _, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    spec = dataclasses.replace(bf16, transforms=(Capability.FLOAT8_TENSORWISE,))
    gate, _ = gates.check(tiny.step(spec), ref, probe, "bf16", lambda m: None)
    assert gate.equivalence is not None and gate.equivalence.passed, gate.detail
    assert gate.differential is not None and gate.differential.passed, gate.detail
    assert gate.differential.fp64 is not None and gate.differential.fp64.scale == "eager fp8 (emulated)"
    assert not gate.passed and gate.causality is not None and not gate.causality.passed


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_the_gates_emulate_each_fp8_recipe_as_torchao_computes_it(recipe):
    """The scale an fp8 rung is judged on is eager fp32 with its recipe's casts emulated (verify/emulated_precision.py), never
    torchao's code: it agrees with torchao's own emulation of the same recipe (output and both gradients, within
    fp32's rounding: 2.4e-7 at most here, 2026-12-04), and the other recipe's casts are 5-7% away."""
    pytest.importorskip("torchao.float8")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from speedladder.verify.emulated_precision import Float8Linear

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 96))
    w, b = layer[0].weight.detach().clone(), layer[0].bias.detach().clone()
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    theirs = convert_to_float8_training(layer, config=config)
    x = torch.randn(8, 16, 64) * torch.linspace(0.1, 3.0, 16)[None, :, None]  # rows of different sizes
    x_theirs = x.clone().requires_grad_()
    y_theirs = theirs(x_theirs)
    g = torch.randn_like(y_theirs)
    y_theirs.backward(g)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    for mine_recipe in ("rowwise", "tensorwise"):
        x_mine, w_mine = x.clone().requires_grad_(), w.clone().requires_grad_()
        y_mine = Float8Linear.apply(x_mine, w_mine, b, mine_recipe)
        y_mine.backward(g)
        errors = (rel(y_mine, y_theirs), rel(x_mine.grad, x_theirs.grad), rel(w_mine.grad, theirs[0].weight.grad))
        if mine_recipe == recipe:
            assert max(errors) < 1e-6, errors
        else:
            assert min(errors) > 1e-2, errors


def test_the_ladder_skips_fp8_at_d2l_512_with_the_shapes_and_builds_nothing(tmp_path, monkeypatch):
    """The climb on an H100-like device with torchao and Triton at hand: the fp8 rung at d2l-512 is recorded as
    skipped with torchao's rule and the block Linears' shapes, and no step is built for it."""
    pytest.importorskip("torchao.float8")
    from speedladder.config.run import RunConfig
    from speedladder.ladder.climb import Ladder
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="d2l-512", device="cpu"))
    work.env = dataclasses.replace(work.env, device_type="cuda", cuda_capability=(9, 0))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name == "triton" else find_spec(name))

    def never(*args, **kwargs):
        raise AssertionError("a step was built for a rung that cannot run")

    monkeypatch.setattr(work, "step", never)
    ladder = Ladder(work, tmp_path)
    bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
    r = ladder.climb(RUNGS["fp8"], RUNGS["fp8"].transform(bf16, work.env), None)
    assert r.status == "skipped" and r.spec is not None and r.spec.compile
    assert r.detail.startswith("not applicable to this model: no block Linear qualifies for torchao's rowwise "
                               "filter") and "mlp.fc 2048x512" in r.detail
