"""Climb the ladder: for each rung, spec = rung(spec) -> build -> warm up -> time -> verify -> save.

Each rung builds on the last rung that ran and passed its gates; one that is
skipped, fails a gate, runs out of memory or raises is recorded as such and
left out of the specs above it. results.json is rewritten after every rung.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from speedladder import measure, predict, results, verify
from speedladder.config import Resolved, RunConfig, pick_device, resolve
from speedladder.data import BatchStream, Corpus, check_fits, load_corpus
from speedladder.model import GPT
from speedladder.progress import Progress
from speedladder.rungs import RUNGS, Env, Rung, StepSpec
from speedladder.step import TrainStep, initial_state, matmul_precision

# The gate batches are drawn from a stream of their own, apart from the timing stream's.
_GATE_SEED_OFFSET = 1


@dataclass
class Workload:
    """Everything a ladder needs that does not change between rungs."""

    cfg: Resolved
    device: torch.device
    corpus: Corpus
    init: dict[str, torch.Tensor]
    env: Env
    params: int
    matmul_params: int

    @property
    def base_spec(self) -> StepSpec:
        return StepSpec(self.cfg.batch_size, self.cfg.seq_len)

    def flops_per_token(self, spec: StepSpec) -> int:
        m = self.cfg.model
        return measure.flops_per_token(self.matmul_params, m.n_layer, m.n_head, m.head_dim, spec.seq_len)


def prepare(run: RunConfig) -> Workload:
    """Resolve the config, load and tokenize the corpus, draw the initial weights."""
    device = pick_device(run.device)
    cfg = resolve(run, device, known_rungs=tuple(RUNGS))
    corpus = load_corpus(cfg.data, cfg.tokenizer)
    check_fits(corpus, cfg.batch_size, cfg.seq_len)
    cfg = cfg.with_vocab(corpus.vocab_size)
    init = initial_state(cfg.model, cfg.seed)
    with torch.device("meta"):
        model = GPT(cfg.model)
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    env = Env(device.type, cap, cfg.batch_multiplier)
    return Workload(cfg, device, corpus, init, env, model.num_params(), model.matmul_params())


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.compiler.reset()  # forget compiled code: the next rung compiles its own, cold in dynamo


class Ladder:
    def __init__(self, work: Workload, run_dir: Path, progress: Progress | None = None,
                 budget: Callable[[], str | None] | None = None) -> None:
        self.work = work
        self.run_dir = run_dir
        self.progress = progress or Progress(quiet=True)
        # Asked before each rung starts: a reason to skip it (a tune's time budget), or None.
        self.budget = budget
        self.references: dict[tuple[int, int], verify.Reference | str] = {}
        cfg = work.cfg
        self.results: dict = {
            "schema": results.SCHEMA,
            "status": "running",
            "created": results.now(),
            "command": results.command_line(),
            "config": cfg.to_dict(),
            "environment": results.environment(work.device),
            "corpus": {"source": work.corpus.source, "tokenizer": work.corpus.tokenizer,
                       "tokens": work.corpus.n_tokens, "vocab_size": work.corpus.vocab_size},
            "model": {"preset": cfg.preset, "params": work.params, "matmul_params": work.matmul_params},
            "rungs": [],
            "learns_check": None,
            "fastest": None,
            "profile": None,
            "predictions": None,
        }
        self.path: list[str] = []  # the rungs whose transforms make the current base spec
        self.save()

    def save(self) -> None:
        results.save(self.results, self.run_dir)

    # -- references -------------------------------------------------------------------------

    def reference(self, spec: StepSpec) -> verify.Reference | str:
        """Eager fp32 at the spec's shape, once per shape; a string says why it could not be made."""
        key = (spec.batch_size, spec.seq_len)
        if key not in self.references:
            cfg = self.work.cfg
            self.progress(f"eager fp32 reference at B={key[0]}, T={key[1]} "
                          f"({cfg.gates.loss_steps} steps)", "gates")
            batches = verify.gate_batches(self.work.corpus, *key, cfg.seed + _GATE_SEED_OFFSET,
                                          cfg.gates.loss_steps)
            try:
                self.references[key] = verify.reference(cfg.model, self.work.init, self.work.device,
                                                        cfg.lr, batches)
            except Exception as e:  # noqa: BLE001 -- recorded in each gate that needed it; the ladder goes on
                why = "ran out of memory" if is_oom(e) else f"failed ({one_line(e)})"
                self.references[key] = f"the eager fp32 reference at B={key[0]} {why}: not verified"
            finally:
                free_device_memory(self.work.device)
        return self.references[key]

    # -- one rung ---------------------------------------------------------------------------

    def climb(self, rung: Rung, spec: StepSpec, base: dict | None, role: str = "rung",
              predicted: dict | None | str = "auto") -> dict:
        """Measure and verify one spec; `predicted` "auto" predicts a ladder rung on the spec it builds on."""
        control = role == "control"
        r: dict = {
            "name": f"{rung.name}-fp32" if control else rung.name,
            "rung": rung.name,
            "role": role,
            "reason": rung.control_reason if control else rung.reason,
            "kind": rung.kind,
            "built_on": base["name"] if base else None,
            "spec": spec.to_dict(),
            "precision": spec.precision,
            "requirement": dataclasses.asdict(rung.requires),
            "status": "pending",
            "detail": "",
            "predicted": None if control else (self._predicted(rung) if predicted == "auto" else predicted),
        }
        self.results["rungs"].append(r)
        say = self.progress.scoped(r["name"])
        unmet = rung.requires.unmet(self.work.env) or self._unfit(spec) or (self.budget and self.budget())
        if unmet:
            r.update(status="skipped", detail=unmet)
            say(f"skipped: {unmet}")
            self.save()
            return r
        started = time.perf_counter()
        try:
            self._measure(r, spec, say)
        except KeyboardInterrupt:
            r.update(status="interrupted", detail="stopped by Ctrl-C during this rung")
            raise
        except Exception as e:  # noqa: BLE001 -- an OOM or a failing technique ends this rung only, recorded
            r.update(status="oom" if is_oom(e) else "error", detail=one_line(e))
            say(f"{r['status']}: {r['detail']}")
        finally:
            free_device_memory(self.work.device)
            r["wall_s"] = time.perf_counter() - started  # the whole rung: build, compile, windows, gates
        self._derive(r, base)
        self.save()
        return r

    def _unfit(self, spec: StepSpec) -> str | None:
        n = self.work.corpus.n_tokens - 1
        if spec.tokens_per_step > n:
            return f"batch {spec.batch_size} x {spec.seq_len} = {spec.tokens_per_step:,} tokens exceeds the corpus ({n:,})"
        return None

    def _measure(self, r: dict, spec: StepSpec, say: Callable[[str], None]) -> None:
        w, cfg = self.work, self.work.cfg
        is_reference = spec == dataclasses.replace(w.base_spec, batch_size=spec.batch_size)
        with matmul_precision(spec):
            ref = None if is_reference else self.reference(spec)
            measure.reset_peak_memory(w.device)
            say("building" + (" and compiling (first step)" if spec.compile else ""))
            step = TrainStep(spec, cfg.model, w.init, w.device, cfg.lr)
            stream = BatchStream(w.corpus, spec.batch_size, spec.seq_len, w.device, cfg.seed)
            timing = measure.run_windows(measure.stepper(step, stream), w.device, spec.tokens_per_step,
                                         cfg.steps, cfg.windows, cfg.warmup, cfg.max_warmup, on_progress=say)
            r["peak_memory_bytes"] = measure.peak_memory(w.device)
            r["timing"] = dataclasses.asdict(timing)
            spread = measure.tokens_per_s(timing)
            if spread is None:
                raise RuntimeError("every timed window recompiled: no valid window")
            r["tokens_per_s"] = dataclasses.asdict(spread)
            r["step_ms"] = measure.step_ms(timing)
            r["compile_s"] = measure.compile_seconds(timing, r["step_ms"] / 1e3) if spec.compile else None
            r["warnings"] = []
            if not timing.settled:
                r["warnings"].append(f"still compiling after {cfg.max_warmup} warm-up steps")
            if len(timing.clean_windows) < len(timing.windows):
                r["warnings"].append(f"{len(timing.windows) - len(timing.clean_windows)} window(s) recompiled "
                                     "and were left out")
            fpt = w.flops_per_token(spec)
            peak = cfg.peak_tflops or (measure.peak_tflops(results.device_name(w.device), spec.precision)
                                       if w.device.type == "cuda" else None)
            r.update(flops_per_token=fpt, tflops=spread.median * fpt / 1e12, peak_tflops=peak,
                     mfu=measure.mfu(spread.median, fpt, peak), status="ok")
            r["gate"] = self._gates(step, ref, is_reference, say)
            say(f"{spread.median:,.0f} tokens/s (min {spread.min:,.0f}, max {spread.max:,.0f}); gate "
                + ("passed" if r["gate"]["passed"] else f"FAILED: {r['gate']['detail']}"))

    def _gates(self, step: TrainStep, ref: verify.Reference | str | None, is_reference: bool,
               say: Callable[[str], None]) -> dict:
        if is_reference:
            return {"passed": True, "reference": True,
                    "detail": "eager fp32 is the reference the other rungs are checked against"}
        if isinstance(ref, str) or ref is None:
            return {"passed": False, "detail": ref or "no reference"}
        spec = step.spec
        gates = self.work.cfg.gates
        say("gates: equivalence with eager fp32, then " + (
            f"loss band over {len(ref.batches)} batches" if spec.same_update else
            f"tokens to AdamW's loss over {gates.target_steps} batches"))
        out: dict = {}
        try:
            eq = verify.equivalence(step, ref)
            if spec.same_update:
                band = verify.loss_band(verify.loss_curve(step, ref.batches), ref.curve, gates.loss_band)
            else:
                band = verify.no_loss_band(spec)
                batches = verify.gate_batches(self.work.corpus, spec.batch_size, spec.seq_len,
                                              self.work.cfg.seed + _GATE_SEED_OFFSET, gates.target_steps)
                adamw = TrainStep(dataclasses.replace(spec, optimizer="adamw"), self.work.cfg.model, self.work.init,
                                  self.work.device, self.work.cfg.lr)
                out["tokens_to_target"] = verify.tokens_to_target(step, adamw, batches)
        except Exception as e:  # noqa: BLE001 -- the speed stays measured; the rung is unverified, so not passed
            why = "ran out of memory" if is_oom(e) else one_line(e)
            return {"passed": False, "detail": f"the gates could not run: {why}"}
        target = out.get("tokens_to_target", {"passed": True, "detail": ""})
        return {"passed": eq["passed"] and band["passed"] and target["passed"], "equivalence": eq, "loss_band": band,
                **out, "detail": eq["detail"] or (band["detail"] if not band["passed"] else "") or target["detail"]}

    def _derive(self, r: dict, base: dict | None) -> None:
        """Speed-ups against the rung built on and against the baseline, and the verdict."""
        r.update(speedup_prev=None, speedup_cum=None, verdict=None, prediction_error=None)
        if r["status"] != "ok":
            return
        baseline = next((x for x in self.results["rungs"] if x["role"] == "rung" and x["status"] == "ok"), None)
        spread = measure.Spread(**r["tokens_per_s"])
        if baseline is not None and baseline is not r:
            r["speedup_cum"] = spread.median / baseline["tokens_per_s"]["median"]
        else:
            r["speedup_cum"] = 1.0
        if base is None:
            r["verdict"] = "baseline"
            return
        base_spread = measure.Spread(**base["tokens_per_s"])
        r["speedup_prev"] = spread.median / base_spread.median
        predicted = (r.get("predicted") or {}).get("speedup")
        if predicted:
            r["prediction_error"] = r["speedup_prev"] / predicted - 1  # > 0: faster than predicted
        # A control is not a step up the ladder: its × prev is against its own rung, stated in the notes.
        r["verdict"] = "control" if r["role"] == "control" else measure.verdict(spread, base_spread)

    # -- measure -> classify -> predict ---------------------------------------------------------

    def profile(self) -> None:
        """Profile the baseline in a child process, before any timed window; predict every rung from it."""
        from speedladder import profile

        say = self.progress.scoped("profile")
        say(f"profiling {self.work.cfg.profile.steps} baseline steps in a child process (no timed window "
            "shares its process)")
        try:
            # The child profiles the baseline only: it needs no rungs (nor to know rungs added in this process).
            child_cfg = dataclasses.replace(self.work.cfg.to_run_config(), rungs=("eager",))
            b = profile.run_in_child(child_cfg, (), self.run_dir / profile.TRACE, self.work.cfg.profile.timeout_s)
        except Exception as e:  # noqa: BLE001 -- the ladder is still worth measuring without predictions
            self.results["profile"] = {"error": one_line(e)}
            say(f"failed, no predictions: {one_line(e)}")
            self.save()
            return
        self.results["profile"] = b
        preds = predict.chain(b, self.work.cfg.rungs, self.work.base_spec, self.work.env)
        self.results["predictions"] = [p.to_dict() for p in preds]
        say(f"{b['regime']}: {b['evidence']}")
        for p in preds:
            say(f"predicted {p.rung}: " + ("n/a" if p.speedup is None else f"{p.speedup:.2f}x") + f" ({p.reason})")
        self.save()

    def _predicted(self, rung: Rung) -> dict | None:
        """This rung's prediction on the spec it actually builds on (the rungs that passed before it)."""
        b = self.results.get("profile")
        if not b or "error" in b or rung.name not in RUNGS:
            return None
        p = predict.chain(b, [*self.path, rung.name], self.work.base_spec, self.work.env)[-1]
        return {"speedup": p.speedup, "reason": p.reason}

    def predicted_together(self, names: tuple[str, ...]) -> dict | None:
        """The prediction for rungs applied together on the baseline: the product of their chained predictions."""
        b = self.results.get("profile")
        if not b or "error" in b:
            return None
        preds = predict.chain(b, list(names), self.work.base_spec, self.work.env)
        if any(p.speedup is None for p in preds):
            return None
        x = math.prod(p.speedup for p in preds)
        return {"speedup": x, "reason": " × ".join(f"{p.rung} {p.speedup:.2f}" for p in preds) + f" ≈ {x:.2f}x"}

    # -- the whole ladder -------------------------------------------------------------------

    def run(self, after_climb: Callable[[], None] | None = None) -> dict:
        """Climb, then (e.g. tune's combinations) `after_climb`, then the learns-check on the fastest."""
        try:
            if self.work.cfg.profile.enabled:
                self.profile()
            self._climb_all()
            if after_climb is not None:
                after_climb()
            self._learns_check()
            self.results["status"] = "complete"
        except KeyboardInterrupt:
            self.results["status"] = "interrupted"
            raise
        finally:
            self.save()
        return self.results

    def _climb_all(self) -> None:
        spec, base = self.work.base_spec, None
        for name in self.work.cfg.rungs:
            rung = RUNGS[name]
            new = rung.transform(spec, self.work.env)
            r = self.climb(rung, new, base)
            if r["status"] == "ok" and rung.control is not None:
                self.climb(rung, rung.control(new), r, role="control")
            if r["status"] == "ok" and r["gate"]["passed"]:
                spec, base = new, r
                self.path.append(name)
        # Measured on the top of the ladder, not built upon: e.g. a memory rung priced against the best spec.
        for name in self.work.cfg.beside:
            rung = RUNGS[name]
            self.climb(rung, rung.transform(spec, self.work.env), base, role="beside")

    def _learns_check(self) -> None:
        cfg = self.work.cfg
        candidates = sorted((r for r in self.results["rungs"]
                             if r["role"] != "control" and r["status"] == "ok" and r["gate"]["passed"]),
                            key=lambda r: r["tokens_per_s"]["median"], reverse=True)
        if cfg.gates.learns_steps == 0 and candidates:
            self.results["fastest"] = candidates[0]["name"]
            self.results["learns_check"] = {"skipped": True, "detail": "--learns-steps 0"}
            return
        for r in candidates:
            say = self.progress.scoped(f"learns-check {r['name']}")
            spec = StepSpec.from_dict(r["spec"])
            try:
                with matmul_precision(spec):
                    step = TrainStep(spec, cfg.model, self.work.init, self.work.device, cfg.lr)
                    stream = BatchStream(self.work.corpus, spec.batch_size, spec.seq_len, self.work.device,
                                         cfg.seed)
                    check = verify.learns_check(step, stream, cfg.gates.learns_steps, cfg.gates.learns_min_drop,
                                                on_progress=say)
            except Exception as e:  # noqa: BLE001 -- a failing learns-check fails its rung, recorded
                check = {"passed": False, "detail": one_line(e)}
            finally:
                free_device_memory(self.work.device)
            check["rung"] = r["name"]
            self.results["learns_check"] = check
            say(("passed" if check["passed"] else "FAILED") +
                (f": loss {check['first_loss']:.3f} -> {check['final_loss']:.3f}" if "drop" in check else "")
                + (f" ({check['detail']})" if check["detail"] else ""))
            if check["passed"]:
                self.results["fastest"] = r["name"]
                return
            r["gate"].update(passed=False, detail=f"learns-check: {check['detail']}")
            self.save()

