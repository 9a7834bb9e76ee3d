"""`speedladder.apply`: the winner, in the user's own training loop.

    model, optimizer, autocast, spec = speedladder.apply(model, "runs/<tune folder>/winner.toml")
    for X, Y in batches:
        with autocast:
            logits, loss = model(X, Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

It puts on the user's own module, in place, what speedladder's own step does for the same spec (step.TrainStep):
the model transforms (checkpointing, fused attention, padded vocabulary, fp8), the optimizer (its implementation,
Muon for the hidden matrices, the learning-rate scale, the recipe's weight decay, betas and eps), torch.compile in
the winner's mode, TF32, and the autocast context to train under; and beside them the recipe's scheduler, clip norm,
fp16's gradient scaler and the micro-steps per update, for a nanoGPT-style loop (docs/models.md). The batch size is
the loop's own to set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from speedladder import codec
from speedladder.config import settings
from speedladder.config.recipe import RecipeConfig
from speedladder.config.resolved import resolve
from speedladder.config.run import MuonConfig, RunConfig, pick_device
from speedladder.errors import UsageError
from speedladder.models import build
from speedladder.records import storage
from speedladder.rungs import MODEL_TRANSFORMS, RUNGS, ModelFacts, compose, env_for
from speedladder.rungs import files as rung_files
from speedladder.spec import StepSpec
from speedladder.step.muon import MuonAdamW
from speedladder.step.schedule import RecipeLR, Span, schedule_of
from speedladder.step.train_step import AUTOCAST, AdamWFactory, make_optimizer


@dataclass(frozen=True)
class Applied:
    """What apply hands back. It unpacks as the four it always did (model, optimizer, autocast, spec); the recipe's
    parts are its fields."""

    model: nn.Module  # the user's module with the winner's transforms, compiled when the winner compiles
    optimizer: torch.optim.Optimizer | MuonAdamW
    autocast: contextlib.AbstractContextManager  # enter it around the forward (and the loss)
    spec: StepSpec  # what was applied
    scheduler: RecipeLR | None = None  # the recipe's schedule: scheduler.step() after each update; None: constant
    grad_clip: float | None = None  # clip_grad_norm_(model.parameters(), grad_clip) before each update; None: off
    scaler: torch.amp.GradScaler | None = None  # fp16: scale the loss, unscale before clipping, step through it
    accum: int = 1  # micro-steps per update: each micro-batch's loss divided by it before backward

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.optimizer, self.autocast, self.spec))


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _from_settings(path: Path, device: torch.device, model: ModelFacts | None) -> tuple[StepSpec, RunConfig]:
    """A config file's spec: its rungs (train's, else run's) composed on its workload's eager step, for this device
    and this model. The config's own rung files are loaded first, refused if they changed since."""
    s = codec.from_data(settings.Settings, settings.read(path))
    rung_files.load(s.run.rung_files, s.run.rung_hashes)
    names = tuple(n for n in (s.train.rungs or s.run.rungs or ()) if n != "eager")
    cfg = resolve(s.run, pick_device(str(device)), known_rungs=tuple(RUNGS))
    env = env_for(device, cfg.batch_multiplier, cfg.run.batch_lr_scale, model, base_batch=cfg.batch_size,
                  accum_steps=cfg.run.recipe.accum_steps)
    for n in names:
        why = RUNGS[n].requires.unmet(env)
        if why:
            raise UsageError(f"rung {n} cannot run here: {why}")
    return compose(names, StepSpec(cfg.batch_size, cfg.seq_len), env), s.run


def winner(where: str | Path | StepSpec, device: torch.device,
           model: ModelFacts | None = None) -> tuple[StepSpec, RunConfig]:
    """The spec to apply and the run configuration it came with (its learning rate, Muon's settings): a StepSpec
    as given; a config file (tune's winner.toml, a run's config.toml); or a folder's winner (tune's, a race's
    fastest to the target, else a run's fastest rung)."""
    if isinstance(where, StepSpec):
        return where, RunConfig()
    path = Path(where)
    if path.suffix == ".toml":
        return _from_settings(path, device, model)
    saved = storage.load(path)
    tuned = saved.tune.winner_spec if saved.tune else None
    raced = saved.race.entry(saved.race.fastest) if saved.race and saved.race.fastest else None
    best = saved.rung(saved.fastest) if saved.fastest else None
    spec = tuned or (raced.spec if raced is not None else None) or (best.spec if best is not None else None)
    if spec is None:
        raise UsageError(f"{where} names no configuration that passed every gate")
    run = saved.config.run
    rung_files.load(run.rung_files, run.rung_hashes)  # the run's own rung files, refused if they changed since
    return spec, run


def apply(model: nn.Module, where: str | Path | StepSpec, optimizer: AdamWFactory | None = None,
          lr: float | None = None, steps: int | None = None) -> Applied:
    """The winner's rungs on `model`, in place; the optimizer over its parameters; the autocast to train under.

    where: tune's winner.toml, a run's config.toml, a run folder, or a StepSpec. optimizer: builds the AdamW part
    from the parameters and the implementation's keywords (fused=True, foreach=True or none), e.g.
    `lambda params, **kw: torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, **kw)`; by default AdamW at the
    run's learning rate (or `lr`), times the spec's learning-rate scale, as speedladder's own step makes it.
    TF32 is process-wide: it is switched on when the winner asks for it. A CUDA-graph spec (max-autotune,
    reduce-overhead) wants torch.compiler.cudagraph_mark_step_begin() before each step. steps: the updates your loop
    makes, the length of a schedule that decays, where the recipe gives none (as `train --steps` is train's).
    """
    device = _device(model)
    source = build.of_module(model)
    spec, run = winner(where, device, source)
    named = dict(model.named_parameters())  # by reference name, before any transform: the objects stay
    for name in spec.transforms:
        try:
            model = source.transform(name, MODEL_TRANSFORMS)(model)
        except RuntimeError as e:  # a capability the model lacks: said as the ladder says it
            raise UsageError(f"the winner's {e} (docs/models.md)") from None
    if spec.tf32:
        torch.set_float32_matmul_precision("high")
    recipe = run.recipe
    opt = make_optimizer(named, spec, run.lr if lr is None else lr, run.muon or MuonConfig(),
                         source.blocks_prefix or "blocks.", optimizer, recipe)
    if spec.compile:
        # torch.compile of a Module is an OptimizedModule (a Module); its annotation says only Callable
        model = cast(nn.Module, torch.compile(model, dynamic=False, mode=spec.compile_mode))
    autocast = torch.autocast(device.type, dtype=AUTOCAST.get(spec.autocast or "", torch.bfloat16),
                              enabled=spec.autocast in AUTOCAST)
    return Applied(model, opt, autocast, spec, _scheduler(opt, recipe, spec, steps),
                   recipe.grad_clip if recipe.clips else None,
                   torch.amp.GradScaler(device.type) if spec.autocast == "fp16" else None, spec.accum)


def _scheduler(opt: torch.optim.Optimizer | MuonAdamW, recipe: RecipeConfig, spec: StepSpec,
               steps: int | None) -> RecipeLR | None:
    """The recipe's schedule on the optimizer, as long as the recipe says or else the loop's `steps`; None when
    the rate never moves."""
    if not recipe.scheduled:
        return None
    if recipe.length is None and steps is None:
        raise UsageError("the recipe's schedule runs over the training's length: give apply(..., steps=N), the "
                         "updates your loop makes, or a --schedule-length in the recipe")
    schedule = schedule_of(recipe, Span(steps or 0, "steps"), spec.tokens_per_step)
    return RecipeLR(opt, schedule, spec.tokens_per_step)
