"""Hugging Face models built offline from a config: compile, bf16 and ckpt on GPT-2 and Llama, the rungs on the
library's own switches, FLOPs by formula, and one line without transformers (docs/models.md)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from conftest import cli

from speedladder.cli import main
from speedladder.config.run import RunConfig
from speedladder.models.definition import count_flops
from speedladder.spec import StepSpec
from speedladder.step.workload import prepare
from speedladder.train.trainer import load_checkpoint

if importlib.util.find_spec("transformers") is None:
    if os.environ.get("CI") == "true":  # .ci/run installs the [hf] extra: these tests must run there
        raise RuntimeError("transformers is missing: pip install -e '.[test,hf]'")
    pytest.skip("needs transformers: pip install -e '.[hf]'", allow_module_level=True)

SMALL = ["--hf-set", "n_layer=1", "--hf-set", "n_embd=128", "--hf-set", "n_head=4"]
# Llama's default MLP (11,008 wide) is sized for a width of 4,096; at width 128 it would hold 97% of the
# parameters and make each CPU step 10x slower, so the tests give it GPT-2's 4x width.
LLAMA_MLP = ["--hf-set", "intermediate_size=512"]
# Every test here builds a Hugging Face model, most of them climbing a ladder with compile: slow.
pytestmark = pytest.mark.slow

MODELS = {"gpt2": ["--hf", "gpt2", *SMALL], "llama": ["--hf", "llama", *SMALL, *LLAMA_MLP]}
FAST = ["--preset", "tiny", "--device", "cpu", "--window-steps", "2", "--loss-steps", "4", "--learns-steps", "60",
        "--no-profile", "--no-process-peak", "--peak-tflops", "fp32=1,bf16=1"]


def hf_set(name: str) -> tuple[str, ...]:
    return tuple(a for a in MODELS[name][2:] if a != "--hf-set")


def climb(out, *args: str) -> dict:
    rc, _, err = cli("run", *FAST, *args, "--out", str(out))
    assert rc == 0, err[-2000:]
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((folder / "results.json").read_text())


DEFAULT = ["eager", "compile", "bf16", "batch", "batch-fp32", "ckpt"]


# Both climb the default ladder less its batch rung: the bigger batch is the same model at another shape, and
# leaving it (and its fp32 control) out saves two cold compiles of CI's time each (on GPT-2, where compile wins and
# every rung above compiles again, about 45 s alone). The whole default ladder, batch included, is climbed by our
# GPT (tests/ladder/test_ladder.py) and nanoGPT's model (tests/models/test_models.py), through the same adapter code.
SHORT = ["--rungs", "eager,compile,bf16,ckpt"]


@pytest.fixture(scope="module", params=list(MODELS))
def climbed(request, tmp_path_factory) -> tuple[str, dict]:
    """`speedladder run --hf gpt2|llama --hf-set n_layer=1 --hf-set n_embd=128 --hf-set n_head=4 --rungs
    eager,compile,bf16,ckpt`: compile included (a minute or two each on a 2-core CPU)."""
    return request.param, climb(tmp_path_factory.mktemp("hf"), *MODELS[request.param], *SHORT)


def test_gpt2_and_llama_climb_compile_bf16_and_ckpt_and_every_gate_passes(climbed):
    name, res = climbed
    names = [r["name"] for r in res["rungs"]]
    assert names == [n for n in DEFAULT if not n.startswith("batch")]
    for r in res["rungs"]:
        assert r["status"] == "ok" and r["gate"]["passed"], (r["name"], r["detail"], r["gate"]["detail"])
        assert r["mfu"] == pytest.approx(r["tflops"] / 1.0)
    model = res["model"]
    assert model["kind"] == "hf" and model["convention"] == "hf" and model["flops_method"] == "formula"
    assert model["blocks"] == {"gpt2": "transformer.h", "llama": "model.layers"}[name]
    assert model["source"]["config"]["vocab_size"] == 28 == model["vocab_size"]  # the workload's vocabulary
    assert model["not_applicable"] == {} and res["fastest"] is not None


def test_sdpa_ckpt_and_pad_vocab_use_the_librarys_switches():
    work = prepare(RunConfig(preset="tiny", device="cpu", hf="gpt2", hf_set=hf_set("gpt2")))
    plain = work.step(work.base_spec).model
    assert plain.config._attn_implementation == "eager" and not plain.is_activation_checkpointing
    step = work.step(StepSpec(4, 32, transforms=("sdpa", "activation-checkpointing", "pad-vocab")))
    m = step.model
    assert m.config._attn_implementation == "sdpa" and m.is_activation_checkpointing
    assert m.get_input_embeddings().weight.shape[0] == 64 and m.get_output_embeddings().weight.shape[0] == 64
    assert m.get_output_embeddings().weight is m.get_input_embeddings().weight  # still tied
    assert set(map(id, step.params.values())) == set(map(id, m.parameters()))  # the step's parameter objects
    x, y = work.gate_batches(work.base_spec, 1)[0]
    ref = work.step(work.base_spec).forward_backward(x, y)[1]
    assert float(step.forward_backward(x, y)[1].detach()) == pytest.approx(float(ref.detach()), rel=1e-5)  # padding leaks nothing
    rebuilt = work.step(work.base_spec).model  # the rungs changed their own model's config, not the next one's
    assert rebuilt.config.vocab_size == 28 and rebuilt.config._attn_implementation == "eager"


def test_sdpa_and_pad_vocab_rungs_pass_their_gates_on_llama(tmp_path):
    res = climb(tmp_path, *MODELS["llama"], "--rungs", "eager,sdpa,pad-vocab")
    for r in res["rungs"][1:]:
        assert r["status"] == "ok" and r["gate"]["passed"], (r["name"], r["detail"], r["gate"]["detail"])


@pytest.mark.parametrize("name", list(MODELS))
def test_the_formula_and_torchs_count_agree(name):
    work = prepare(RunConfig(preset="tiny", device="cpu", hf=name, hf_set=hf_set(name)))
    assert work.model.flops_method == "formula"
    formula = work.model.flops_per_token(32)
    assert count_flops(work.model, 32) == pytest.approx(formula, rel=0.05)
    assert (work.model.shapes is not None) == (name == "gpt2")  # GPT-2 in our GPT's terms; Llama unknown there


def test_a_local_config_json_and_its_overrides(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2, "resid_pdrop": 0.1}))
    work = prepare(RunConfig(preset="tiny", device="cpu", hf=str(tmp_path), hf_set=("n_layer=3",)))
    cfg = work.model.source["config"]
    assert (cfg["n_layer"], cfg["n_embd"], cfg["resid_pdrop"]) == (3, 64, 0.0)
    assert "resid_pdrop=0" in work.model.dropout
    for bad, message in (("nope=1", "has no field 'nope'"), ("n_layer", "wants KEY=VALUE"),
                         ("n_head=5", "refused by the model")):  # 64 wide: 5 heads do not divide it
        assert main(["run", *FAST, "--hf", str(path), "--hf-set", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("text, message", [('{"model_type": "gpt2", "n_layer": ', "is not valid JSON"),
                                           ("[1, 2]", "has no model_type"),
                                           ('{"model_type": "no-such-model"}', "model_type 'no-such-model' is not one")])
def test_a_malformed_config_json_is_one_line_and_exit_2(text, message, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["run", *FAST, "--hf", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_without_transformers_hf_is_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert main(["run", *FAST, "--hf", "gpt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install speedladder[hf]" in err and len(err.splitlines()) == 1


def test_train_on_hf_saves_a_checkpoint_that_reloads(tmp_path):
    rc, out, err = cli("train", "--preset", "tiny", "--device", "cpu", *MODELS["gpt2"], "--compose",
                       "eager,sdpa,pad-vocab,ckpt", "--steps", "10", "--log-every", "5", "--sample-tokens", "5",
                       "--out", str(tmp_path))
    assert rc == 0, err
    assert "sample (5 tokens" in out
    (path,) = tmp_path.glob("*/checkpoint.pt")
    model, ckpt = load_checkpoint(path)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.get_input_embeddings().weight.shape == (28, 128)
    assert torch.equal(model.lm_head.weight, ckpt["model"]["lm_head.weight"])
