"""The gates against the rounding fuzz, seed after seed (docs/measurement.md, rule 12; docs/benchmarks.md).

For each model, the eager fp32 reference and bf16 are gated once; then the rounding fuzz (rungs/fuzz.py) is gated
after eager and after bf16 at every seed, as the ladder gates a rung. Prints one line per model and position:
how many seeds passed, the worst quantity's distance over what it was allowed, and the kink census; writes every
gate's numbers to --out as JSON.

    PYTHONPATH=src python3 bench/gates.py --seeds 50 --out bench/out/fuzz.json
    PYTHONPATH=src python3 bench/gates.py --models d2l-cpu --seeds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch

from speedladder import processor
from speedladder.config.recipe import RecipeConfig
from speedladder.config.run import RunConfig
from speedladder.progress import Progress
from speedladder.records import Fp64, to_dict
from speedladder.rungs import MODEL_TRANSFORMS, rounding_fuzz
from speedladder.step.workload import prepare
from speedladder.verify.gates import Gates

HERE = Path(__file__).resolve().parent
MODELS = {
    "d2l-cpu": RunConfig(preset="d2l-cpu", device="cpu"),
    "tiny": RunConfig(preset="tiny", device="cpu"),
    "nanogpt": RunConfig(preset="d2l-cpu", device="cpu", model_source=f"{HERE / 'models' / 'nanogpt_style.py'}:GPT"),
    "llama": RunConfig(preset="d2l-cpu", device="cpu", hf="llama",
                       hf_set=("n_layer=2", "n_embd=128", "n_head=4", "intermediate_size=512")),
}


def worst(f: Fp64 | None) -> tuple[str, float]:
    """The quantity nearest its allowance, and its distance over the allowance (above 1 fails)."""
    best = ("—", 0.0)
    for d in (f.logits, f.loss, f.grad, f.curve) if f else ():
        if d is not None and d.rung is not None and d.allowed:
            ratio = d.rung / d.allowed
            if ratio > best[1]:
                best = (f"{d.name}" if d is not f.grad else f"grad {d.name}", ratio)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--scale", type=float, default=1.0, help="the fuzz's magnitude, times the unit roundoff")
    p.add_argument("--out", default=None, help="write every gate's record here (JSON)")
    p.add_argument("--recipe", default="default", help="the training recipe the references train with")
    p.add_argument("--schedule-length", type=int, default=None, help="the recipe's schedule, in steps")
    a = p.parse_args()
    torch.set_num_threads(1)
    cpu = processor.cpu()
    print(f"{platform.processor() or platform.machine()} · {cpu.capability} · bf16 native: {cpu.bf16_native} · "
          f"torch {torch.__version__} · {a.seeds} seeds, fuzz x{a.scale:g} · recipe {a.recipe}", flush=True)
    saved: dict = {"seeds": a.seeds, "scale": a.scale, "torch": torch.__version__, "isa": cpu.capability,
                   "models": {}}
    failures = 0
    for name in a.models.split(","):
        started = time.perf_counter()
        recipe = RecipeConfig.named(a.recipe, **({"length": a.schedule_length} if a.schedule_length else {}))
        work = prepare(dataclasses.replace(MODELS[name], recipe=recipe))
        gates = Gates(work, Progress(quiet=True))
        ref = gates.reference(work.base_spec)
        if isinstance(ref, str) or ref.fp64 is None:
            print(f"{name}: no fp64 reference ({ref if isinstance(ref, str) else ref.fp64_why})")
            return 1
        bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
        gate, bf16_probe = gates.check(work.step(bf16), ref, ref.probe, "eager", lambda m: None)
        census = {k: to_dict(v) for k, v in ref.kinks.items()}
        saved["models"][name] = {"bf16": to_dict(gate), "census": census, "positions": {}}
        for position, spec, base, base_name in (("eager", work.base_spec, ref.probe, "eager"),
                                                  ("bf16", bf16, bf16_probe, "bf16")):
            passed, ratios, details = 0, [], []
            for seed in range(a.seeds):
                MODEL_TRANSFORMS["fuzz"] = rounding_fuzz(scale=a.scale, seed=seed)
                g, _ = gates.check(work.step(dataclasses.replace(spec, transforms=("fuzz",))), ref, base, base_name,
                                   lambda m: None)
                passed += g.passed
                w = max((worst(c.fp64) for c in (g.equivalence, g.differential) if c is not None),
                        key=lambda t: t[1])
                ratios.append(w[1])
                details.append({"seed": seed, "passed": g.passed, "detail": g.detail, "worst": w[0],
                                "over_allowed": w[1]})
            failures += a.seeds - passed
            top = max(range(a.seeds), key=lambda i: ratios[i])
            k = ref.kinks.get("probe")
            print(f"{name:8s} after {position:5s}: {passed}/{a.seeds} passed; worst {max(ratios):.2f} of its "
                  f"allowance ({details[top]['worst']}, seed {top}); census at the probe {k.near if k else '—'} "
                  f"(gate batch 0: {k.near_first if k else '—'})", flush=True)
            saved["models"][name]["positions"][position] = details
        print(f"{name:8s} {time.perf_counter() - started:.0f} s", flush=True)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(saved, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
