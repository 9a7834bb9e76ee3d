"""The gates' resolution: the smallest planted change each gate catches, after eager and after bf16
(docs/measurement.md, rule 12), and which scale separates wrong precision rungs from clean ones.

Plants, each wrong everywhere and each scaled by a magnitude, scanned from large to small:
- `scale`: attention's scores times (1 + m) (the queries scaled: the softmax's temperature off by m);
- `eps`: every LayerNorm's eps times m;
- `bias`: block 0's MLP bias times (1 - m) (m = 1: dropped);
- `gelu`: GELU's tanh approximation in place of erf (one magnitude), on a nanoGPT-style model.
For each, every check's verdict (equivalence at the trained weights, the differential check at the probe weights,
the loss band, causality) is kept, and the smallest magnitude that check failed at is reported.

Then the precision rungs (--precision): clean ones (bf16, bf16 with the rounding fuzz, fp8 through torchao's
emulation) and planted ones whose fault sits in the autocast path itself (a gradient dropped under autocast, for
bf16 and fp8), each judged by three scales: eager under autocast (the rung's own path), eager fp32 with the
precision's rounding emulated (the gates' rule) and eager fp32's distance times the ratio of unit roundoffs (the
per-precision table the docs' figures show beside them is gone from the code). A scale separates if it passes every
clean rung and fails every plant.

    PYTHONPATH=src python3 bench/resolution.py --out docs/gate-resolution.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from speedladder import processor
from speedladder.config.run import RunConfig
from speedladder.models import float8
from speedladder.progress import Progress
from speedladder.records import Gate
from speedladder.rungs import MODEL_TRANSFORMS, float8_linears, rounding_fuzz
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, prepare
from speedladder.verify import probes
from speedladder.verify.distance import Errors, errors, judge
from speedladder.verify.gates import Gates
from speedladder.verify.tolerance import TOLERANCES

HERE = Path(__file__).resolve().parent
CHECKS = ("equivalence", "differential", "loss_band", "causality")


def scale_scores(m: float) -> Callable[[nn.Module], nn.Module]:
    def plant(model: nn.Module) -> nn.Module:
        for block in model.blocks:
            width = block.attn.qkv.out_features // 3

            def hook(_mod: nn.Module, _args: object, out: torch.Tensor, width: int = width) -> torch.Tensor:
                q, rest = out[..., :width], out[..., width:]
                return torch.cat([q * (1 + m), rest], dim=-1)
            block.attn.qkv.register_forward_hook(hook)
        return model
    return plant


def layernorm_eps(m: float) -> Callable[[nn.Module], nn.Module]:
    def plant(model: nn.Module) -> nn.Module:
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.eps *= m
        return model
    return plant


def block_bias(m: float) -> Callable[[nn.Module], nn.Module]:
    def plant(model: nn.Module) -> nn.Module:
        fc = model.blocks[0].mlp.fc
        fc.register_forward_hook(lambda mod, _args, out: out - m * mod.bias)
        return model
    return plant


def gelu_tanh(_m: float) -> Callable[[nn.Module], nn.Module]:
    def plant(model: nn.Module) -> nn.Module:
        for block in model.h:
            block.gelu = nn.GELU(approximate="tanh")
        return model
    return plant


PLANTS: dict[str, tuple[str, Callable[[float], Callable[[nn.Module], nn.Module]], tuple[float, ...]]] = {
    "scale": ("d2l-cpu", scale_scores, (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7)),
    "eps": ("d2l-cpu", layernorm_eps, (1e4, 1e3, 100.0, 30.0, 10.0, 3.0, 2.0, 1.5, 1.2, 1.1)),
    "bias": ("d2l-cpu", block_bias, (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)),
    "gelu": ("nanogpt", gelu_tanh, (1.0,)),
}
RUNS = {"d2l-cpu": RunConfig(preset="d2l-cpu", device="cpu"),
        "nanogpt": RunConfig(preset="d2l-cpu", device="cpu",
                             model_source=f"{HERE / 'models' / 'nanogpt_style.py'}:GPT")}


def verdicts(g: Gate) -> dict[str, bool]:
    return {c: getattr(g, c).passed for c in CHECKS if getattr(g, c) is not None and getattr(g, c).applies}


class Bench:
    def __init__(self, work: Workload) -> None:
        self.work = work
        self.gates = Gates(work, Progress(quiet=True))
        ref = self.gates.reference(work.base_spec)
        assert not isinstance(ref, str) and ref.fp64 is not None
        self.ref = ref
        self.bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
        gate, probe = self.gates.check(work.step(self.bf16), ref, ref.probe, "eager", lambda m: None)
        assert gate.passed, gate.detail
        self.bf16_probe = probe

    def gate(self, position: str, transforms: tuple[str, ...]) -> Gate:
        spec, base, name = ((self.work.base_spec, self.ref.probe, "eager") if position == "eager" else
                            (self.bf16, self.bf16_probe, "bf16"))
        spec = dataclasses.replace(spec, transforms=transforms)
        with matmul_precision(spec):
            return self.gates.check(self.work.step(spec), self.ref, base, name, lambda m: None)[0]


def resolution() -> dict:
    out: dict = {}
    benches: dict[str, Bench] = {}
    for plant, (model, make, magnitudes) in PLANTS.items():
        bench = benches.setdefault(model, Bench(prepare(RUNS[model])))
        out[plant] = {"model": model, "positions": {}}
        for position in ("eager", "bf16"):
            rows = []
            for m in magnitudes:
                MODEL_TRANSFORMS["plant"] = make(m)
                g = bench.gate(position, ("plant",))
                rows.append({"magnitude": m, "passed": g.passed, "checks": verdicts(g), "detail": g.detail})
                print(f"{plant:6s} {position:5s} m={m:<8g} {'passed' if g.passed else 'CAUGHT'} "
                      f"{ {k: v for k, v in verdicts(g).items() if not v} }", flush=True)
            out[plant]["positions"][position] = rows
    return out


def smallest(rows: list[dict], check: str | None) -> float | None:
    """The smallest magnitude the check (or the whole gate) caught, scanning from large to small."""
    caught = [r["magnitude"] for r in rows if (not r["passed"] if check is None else r["checks"].get(check) is False)]
    return min(caught, key=abs) if caught else None


# -- precision rungs: which scale separates -------------------------------------------------------------------

@contextmanager
def drop_grad_under_autocast(name: str) -> Iterator[None]:
    original = TrainStep.forward_backward

    def forward_backward(self: TrainStep, x: torch.Tensor, y: torch.Tensor, compiled: bool = True):
        logits, loss = original(self, x, y, compiled)
        if self.spec.autocast == "bf16" and self.params[name].grad is not None:
            self.params[name].grad.zero_()
        return logits, loss
    TrainStep.forward_backward = forward_backward  # type: ignore[method-assign]
    try:
        yield
    finally:
        TrainStep.forward_backward = original  # type: ignore[method-assign]


UNIT = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp8": 2.0 ** -4}


def precision_scales(bench: Bench) -> list[dict]:
    work, ref, gates = bench.work, bench.ref, bench.gates
    assert ref.fp64 is not None
    MODEL_TRANSFORMS["fuzz"] = rounding_fuzz(seed=0)
    MODEL_TRANSFORMS["float8"] = functools.partial(float8_linears, emulate=True)
    float8.worth = lambda module, name, recipe: True  # the preset's Linears are below torchao's size filter: set aside
    fp8 = dataclasses.replace(bench.bf16, transforms=("float8",))
    cases = [("bf16", bench.bf16, None, "clean"),
             ("bf16 + fuzz", dataclasses.replace(bench.bf16, transforms=("fuzz",)), None, "clean"),
             ("fp8 (torchao)", fp8, None, "clean"),
             ("bf16, a gradient dropped under autocast", bench.bf16, "blocks.0.attn.qkv.weight", "wrong"),
             ("fp8, a gradient dropped under autocast", fp8, "blocks.1.mlp.fc.weight", "wrong")]
    rows = []
    for label, spec, dropped, kind in cases:
        with drop_grad_under_autocast(dropped) if dropped else nullcontext(), matmul_precision(spec):
            step = work.step(spec)
            mine = [probes.outputs(step, w, ref.batch, ref.probe_rows) for w in (ref.weights, ref.probe_weights)]
            own_spec = dataclasses.replace(work.base_spec, autocast=spec.autocast,
                                           transforms=tuple(t for t in spec.transforms if t == "float8"))
            own = work.step(own_spec)
            autocast = [probes.outputs(own, w, ref.batch, ref.probe_rows) for w in (ref.weights, ref.probe_weights)]
        at = gates.eager_at(spec, ref)
        assert at is not None
        _, em_trained, em_probe = at
        truths = (ref.fp64.trained, ref.fp64.probe)
        rung_err = [errors(o, t) for o, t in zip(mine, truths)]
        scales = {
            "eager under autocast (its own path)": [errors(o, t) for o, t in zip(autocast, truths)],
            "eager fp32, the precision emulated": [em_trained, em_probe],
            "eager fp32 x unit roundoff ratio": [_times(e, UNIT[spec.precision] / UNIT["fp32"])
                                                 for e in ref.probe.errors or ()],
        }
        row: dict = {"rung": label, "kind": kind, "precision": spec.precision, "scales": {}}
        for scale, errs in scales.items():
            judged = [judge(r, (scale, e), None, spec.precision, TOLERANCES[spec.precision])
                      for r, e in zip(rung_err, errs)]
            row["scales"][scale] = {"passed": all(j.passed for j in judged),
                                    "detail": "; ".join(j.detail for j in judged if j.detail)}
        rows.append(row)
        print(f"{label:42s} " + " | ".join(f"{s.split(' (')[0][:24]}: {'pass' if v['passed'] else 'FAIL'}"
                                          for s, v in row["scales"].items()), flush=True)
    return rows


def _times(e: Errors, k: float) -> Errors:
    return Errors(logits=None if e.logits is None else e.logits * k, loss=e.loss * k,
                        grads={n: v * k for n, v in e.grads.items()}, curve=None if e.curve is None else e.curve * k)


def markdown(data: dict) -> str:
    lines = ["| plant | model | after | equivalence | differential | loss band | causality | the gate |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for plant, d in data["resolution"].items():
        for position, rows in d["positions"].items():
            cells = [smallest(rows, c) for c in CHECKS] + [smallest(rows, None)]
            lines.append(f"| {plant} | {d['model']} | {position} | "
                         + " | ".join("—" if v is None else f"{v:g}" for v in cells) + " |")
    lines += ["", "| precision rung | kind | " + " | ".join(data["precision"][0]["scales"]) + " |",
              "| --- | --- |" + " --- |" * len(data["precision"][0]["scales"])]
    for row in data["precision"]:
        lines.append(f"| {row['rung']} | {row['kind']} | "
                     + " | ".join("pass" if v["passed"] else "FAIL" for v in row["scales"].values()) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the verdicts here (JSON), and the tables beside it (.md)")
    a = p.parse_args()
    torch.set_num_threads(1)
    cpu = processor.cpu()
    head = (f"{platform.machine()} · {cpu.capability} · bf16 native: {cpu.bf16_native} · torch {torch.__version__}")
    print(head, flush=True)
    data = {"machine": head, "resolution": resolution(),
            "precision": precision_scales(Bench(prepare(RUNS["d2l-cpu"])))}
    print(markdown(data))
    if a.out:
        Path(a.out).write_text(json.dumps(data, indent=1))
        Path(a.out).with_suffix(".md").write_text(markdown(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
