"""A StepSpec made real: model, optimizer, precision and compilation.

A TrainStep call does one whole training step (host batch -> device copy ->
forward -> loss -> backward, over the spec's micro-batches -> the recipe's
clipping, gradient scaler and schedule -> AdamW update) and returns the loss as
a device tensor, never a Python number: reading it would synchronize the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from speedladder.config.recipe import RecipeConfig
from speedladder.config.run import MuonConfig
from speedladder.models import build
from speedladder.models.definition import ModelDef
from speedladder.models.gpt import GPTConfig
from speedladder.rungs import MODEL_TRANSFORMS, NEW_PARAMS, OPTIMIZERS, RungError
from speedladder.spec import StepSpec
from speedladder.step.muon import MuonAdamW, is_hidden_matrix, muon_optimizer
from speedladder.step.schedule import RecipeLR, Schedule, optimizers_in, param_groups

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


@contextlib.contextmanager
def matmul_precision(spec: StepSpec) -> Iterator[None]:
    """TF32 is process-wide state: set it for one rung and put it back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if spec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _local_part(shard: DTensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of a whole tensor, laid out as a DTensor shard's local tensor is (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    # Every rank holds the same whole tensor, so each takes its own part; src_data_rank=None: no scatter.
    return distribute_tensor(full.to(shard.device), shard.device_mesh, shard.placements,
                             src_data_rank=None).to_local()


def model_def(model: ModelDef | GPTConfig) -> ModelDef:
    """A ModelDef; our GPT's config becomes the ModelDef of our GPT."""
    return model if isinstance(model, ModelDef) else build.ours(model)


def initial_state(model: ModelDef | GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The weights every rung starts from, on the host, so each rung sees the same model."""
    return build.initial_state(model_def(model), seed)


AdamWFactory = Callable[..., torch.optim.Optimizer]  # (params, **implementation) -> an AdamW-like optimizer


def make_optimizer(params: dict[str, nn.Parameter], spec: StepSpec, lr: float, muon: MuonConfig,
                   blocks_prefix: str = "blocks.", adamw: AdamWFactory | None = None,
                   recipe: RecipeConfig | None = None) -> torch.optim.Optimizer | MuonAdamW:
    """The optimizer a spec asks for, over the model's parameters by name: AdamW in the implementation named
    (fused, foreach, or torch's default) with the recipe's weight decay, betas and eps and its split of what decays
    (step/schedule.param_groups), or Muon for the hidden matrices under `blocks_prefix` and that AdamW for the rest; every
    learning rate times spec.lr_scale. `adamw` builds the AdamW part (speedladder.apply passes the user's own),
    given the parameters (or the recipe's groups) and the implementation's keywords (fused=True, foreach=True or
    none)."""
    scale, r = spec.lr_scale, recipe or RecipeConfig()
    adamw = adamw or (lambda ps, **kind: torch.optim.AdamW(ps, lr=lr * scale, weight_decay=r.weight_decay,
                                                           betas=r.betas, eps=r.eps, **kind))
    if spec.optimizer == "muon":
        hidden = [p for n, p in params.items() if is_hidden_matrix(n, p, blocks_prefix)]
        rest = {n: p for n, p in params.items() if not is_hidden_matrix(n, p, blocks_prefix)}
        return MuonAdamW(muon_optimizer(hidden, lr=muon.lr * scale, momentum=muon.momentum, nesterov=muon.nesterov,
                                        ns_steps=muon.ns_steps), adamw(param_groups(rest, r)))
    if spec.optimizer in OPTIMIZERS:  # a rung's own (rungs/registry.py): the named parameters and the learning rate
        return OPTIMIZERS[spec.optimizer](dict(params), lr * scale)
    if spec.optimizer not in ("adamw", "adamw-fused", "adamw-foreach"):
        raise ValueError(f"unknown optimizer {spec.optimizer!r}")
    # Plain "adamw" leaves the implementation to torch's default; the others ask for one.
    kind = {"adamw-fused": {"fused": True}, "adamw-foreach": {"foreach": True}}.get(spec.optimizer, {})
    return adamw(param_groups(params, r), **kind)


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # a spec's autocast, as a dtype


class TrainStep:
    """One spec's training step: what is timed, gated and trained.

    Owns: the model (built from the initial weights, its spec's transforms applied, wrapped, compiled), the
    optimizer (the recipe's parameter groups), the schedule and the gradient scaler (fp16), and the counts of its
    updates and of the scaler's skipped ones.

    In order: built once (`__init__`: build, transform, wrap, compile lazily on the first call); each call runs the
    micro-steps' forward and backward under the spec's precision (`_micro_steps`), then `update`: unscale (fp16),
    clip, step, clear the gradients, advance the schedule. The gates use `forward_backward`, one pass that leaves the
    gradients in .grad, unscaled; `reset` puts back the initial weights with a fresh optimizer, schedule and scaler,
    so the step the ladder timed is the one it gates.

    Leaves behind: the trained weights in `model`, each call's loss (returned, detached), and `updates` and
    `skipped_updates()`, which the ladder records (fp16's skipped steps); it saves nothing itself."""

    def __init__(self, spec: StepSpec, model: ModelDef | GPTConfig, init: dict[str, torch.Tensor],
                 device: torch.device, lr: float, wrap: Callable[[nn.Module], nn.Module] | None = None,
                 muon: MuonConfig | None = None, dtype: torch.dtype | None = None,
                 recipe: RecipeConfig | None = None, schedule: Schedule | None = None) -> None:
        self.spec = spec
        self.source = model_def(model)
        self.device = device
        self.lr = lr
        self.muon = muon or MuonConfig()
        self.recipe = recipe or RecipeConfig()
        self.schedule = schedule or Schedule()
        self.init = init
        built: nn.Module = self.source.build(device)  # dropout off: two runs of one step compute the same
        built.load_state_dict(init)
        if dtype is not None:  # float64: the gates' reference every rung's error is measured from (verify/distance.py)
            built = built.to(dtype)
        # Parameters by their reference names, taken before any transform renames modules.
        self.params = dict(built.named_parameters())
        # Their reference shapes: a transform may grow a parameter in place (pad-vocab adds rows at the end).
        self.shapes = {n: p.shape for n, p in self.params.items()}
        # Every entry of the plain model's state dict (a tied matrix under each of its names), for checkpoints.
        self.state = built.state_dict(keep_vars=True)
        self.model: nn.Module = built
        for name in spec.transforms:
            self.model = self.source.transform(name, MODEL_TRANSFORMS)(self.model)
        self.added = self._added_params(spec)
        if wrap is not None:  # e.g. DistributedDataParallel: after the transforms, before compilation
            self._wrap(wrap)
        # Called in its own convention, answering (logits, loss) with one loss for every model (models/definition.py).
        adapted = self.source.adapter(self.model)
        self.eager_forward = adapted  # uncompiled: what evaluation calls, so no eval graph is compiled
        # dynamic=False: one fixed shape per rung; a shape change must recompile, and is counted.
        self.forward = (torch.compile(adapted, dynamic=False, mode=spec.compile_mode) if spec.compile
                        else adapted)
        self._autocast = torch.autocast(device.type, dtype=AUTOCAST.get(spec.autocast or "", torch.bfloat16),
                                        enabled=spec.autocast in AUTOCAST)
        self._fresh()

    def _added_params(self, spec: StepSpec) -> dict[str, torch.Tensor]:
        """Parameters the transforms made, each with its first value (reset() restores it), under its name in the
        transformed model. A transform may grow a parameter in place, never swap in a new one, unless its rung
        declared so (an architecture rung, or changes_params): reset() and the gates would miss it."""
        ours = {id(p) for p in self.params.values()}
        new = {n: p for n, p in self.model.named_parameters() if id(p) not in ours}
        if not new:
            return {}
        undeclared = [t for t in spec.transforms if t not in NEW_PARAMS]
        if undeclared and not any(t in NEW_PARAMS for t in spec.transforms):
            raise RungError(f"a model transform of {', '.join(undeclared)} made new parameters ({', '.join(new)}) "
                            "without declaring changes_params=True: the gates cannot compare it")
        self.params.update(new)
        self.shapes.update({n: p.shape for n, p in new.items()})
        return {n: p.detach().clone() for n, p in new.items()}

    def _wrap(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Wrap the model, then point params and state at the tensors the wrapped model trains.

        DDP keeps the parameter objects; FSDP2's fully_shard puts a sharded DTensor Parameter in place of each
        (on the same module, under the same attribute), so the references taken before it would go stale:
        reset() would load weights into tensors nothing trains, and Muon would update them. Each parameter is
        found again where it lived.
        """
        slots: dict[int, tuple[nn.Module, str]] = {}
        for module in self.model.modules():
            for attr, p in module._parameters.items():
                if p is not None:
                    slots.setdefault(id(p), (module, attr))
        self.model = wrap(self.model)
        now = {id(p): q for p in self.params.values()
               if id(p) in slots and (q := slots[id(p)][0]._parameters[slots[id(p)][1]]) is not None}
        self.params = {n: now.get(id(p), p) for n, p in self.params.items()}
        self.state = {k: now.get(id(t), t) for k, t in self.state.items()}

    @property
    def vocab_size(self) -> int:
        """The real vocabulary (a padded head has more rows): what the gates compare."""
        return self.source.vocab_size

    def _new_optimizer(self) -> torch.optim.Optimizer | MuonAdamW:
        return make_optimizer(self.params, self.spec, self.lr, self.muon, self.source.blocks_prefix or "blocks.",
                              recipe=self.recipe)

    def _fresh(self, updates: int = 0) -> None:
        """A new optimizer, the schedule at update `updates` (none when the rate never moves), a new gradient scaler
        (fp16) and its count of skipped updates at zero."""
        self.optimizer = self._new_optimizer()
        self.scheduler = (RecipeLR(self.optimizer, self.schedule, self.spec.tokens_per_step, updates)
                          if self.schedule.moves else None)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.spec.autocast == "fp16" else None
        if self.scaler is not None and not optimizers_in(self.optimizer):
            raise RungError(f"fp16's gradient scaler needs a torch optimizer; {self.spec.optimizer}'s is not one")
        self.updates = updates
        self.skipped = torch.zeros((), device=self.device)  # updates the scaler skipped (inf or NaN gradients)

    def reference_part(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The part of a (possibly padded) parameter or gradient that is the reference parameter."""
        rows = self.shapes[name][0] if self.shapes[name] else None
        return t if rows is None or t.shape[0] == rows else t[:rows]

    def reference_state(self) -> dict[str, torch.Tensor]:
        """The state under the reference names and shapes, on the host: loadable into the plain model."""
        return {k: (t[: self.init[k].shape[0]] if t.ndim and t.shape[0] != self.init[k].shape[0] else t)
                .detach().cpu().clone() for k, t in self.state.items()}

    def beyond_reference(self) -> dict[str, torch.Tensor]:
        """What reference_state leaves out of the trained parameters, on the host: the rows a transform padded a
        parameter with, and whole parameters a transform made. With reference_state, the parameters exactly as
        trained (what `restore` puts back)."""
        out = {}
        for name, p in self.params.items():
            if name not in self.init:
                out[name] = p.detach().cpu().clone()
            elif p.shape != self.shapes[name]:
                out[name] = p.detach()[self.shapes[name][0]:].cpu().clone()
        return out

    def restore(self, weights: dict[str, torch.Tensor], beyond: dict[str, torch.Tensor],
                optimizer_state: dict, updates: int = 0, scaler_state: dict | None = None) -> None:
        """The parameters and the optimizer as a checkpoint saved them: reference_state's weights, the rest from
        beyond_reference, then the optimizer's state dict; the schedule at `updates`, the scaler's state."""
        self.reset({**weights, **{n: t for n, t in beyond.items() if n not in self.init}}, updates)
        if self.scaler is not None and scaler_state:
            self.scaler.load_state_dict(scaler_state)
        with torch.no_grad():
            for name, rows in beyond.items():
                if name in self.init:  # a padded parameter: reset zeroed its padding
                    self.params[name][self.shapes[name][0]:].copy_(rows)
        self.optimizer.load_state_dict(optimizer_state)
        if self.scheduler is not None:  # the loaded state made new parameter groups: the schedule acts on those
            self.scheduler = RecipeLR(self.optimizer, self.schedule, self.spec.tokens_per_step, updates)

    def reset(self, weights: dict[str, torch.Tensor] | None = None, updates: int = 0) -> None:
        """Back to the initial weights (or the given ones) with a fresh optimizer, schedule and scaler; compiled
        code is kept."""
        weights = self.init if weights is None else weights
        with torch.no_grad():
            for name, p in self.params.items():
                # A parameter a transform made (an architecture rung's) goes back to its own first value.
                w = weights[name] if name in weights else self.added[name]
                if p.shape != self.shapes[name]:
                    p.zero_()  # padding rows back to zero
                if hasattr(p, "device_mesh"):  # an FSDP2 shard (a DTensor): this rank's part of the weight
                    shard = cast("DTensor", p)  # hasattr does not narrow to DTensor
                    shard.to_local().copy_(_local_part(shard, w))
                else:
                    self.reference_part(name, p).copy_(w)
                p.grad = None
        self._fresh(updates)

    def _micro_steps(self, x: torch.Tensor, y: torch.Tensor, compiled: bool, scale: float | None,
                     rows: int | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Forward and backward over the spec's micro-batches (one: the whole batch), each micro-batch's loss over
        their number backpropagated, as nanoGPT's loop does, times `scale` (fp16's loss scale; None: the scaler's).
        The logits of the first `rows` sequences (all: None) and the mean loss."""
        n = self.spec.accum
        forward = self.forward if compiled else self.eager_forward
        kept: list[torch.Tensor] = []
        total = torch.zeros((), device=x.device)
        for xs, ys in zip(x.chunk(n), y.chunk(n)) if n > 1 else [(x, y)]:
            if self.spec.cudagraphs and compiled:
                # A new iteration for CUDA graph trees: the previous step's graph outputs may be overwritten now.
                torch.compiler.cudagraph_mark_step_begin()
            with self._autocast:
                logits, loss = forward(xs, ys)
            part = loss / n if n > 1 else loss
            if scale is not None:
                part = part * scale
            elif self.scaler is not None:
                part = self.scaler.scale(part)
            part.backward()
            if n == 1:
                return logits, loss
            need = (xs.shape[0] if rows is None else rows) - sum(k.shape[0] for k in kept)
            if logits is not None and need > 0:
                kept.append(logits[:need].detach().clone())  # a copy: the micro-batch's logits are freed
            total = total + loss.detach().float()
        return (torch.cat(kept) if kept else None), total / n

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, compiled: bool = True,
                         rows: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Logits (None from a model whose forward returns a loss only; with accumulation, those of the first
        `rows` sequences) and loss of one batch, over the spec's micro-steps, gradients added to .grad; no update.
        Under fp16 the loss is scaled as the scaler would, halved until no gradient overflows, and the gradients
        unscaled. compiled=False: through the uncompiled model (a failed gate's explanation hooks its modules)."""
        if self.scaler is None:
            return self._micro_steps(x, y, compiled, None, rows)
        prior = {n: p.grad for n, p in self.params.items() if p.grad is not None}
        s = self.scaler.get_scale()
        while True:
            for p in self.params.values():
                p.grad = None
            logits, loss = self._micro_steps(x, y, compiled, s, rows)
            grads = [p.grad for p in self.params.values() if p.grad is not None]
            if s <= 1 or all(bool(torch.isfinite(g).all()) for g in grads):
                break
            s /= 2  # what the scaler's backoff would do on an overflow
        for g in grads:
            g.div_(s)
        for n, g in prior.items():
            grad = self.params[n].grad
            self.params[n].grad = g if grad is None else grad.add_(g)
        return logits, loss

    def update(self) -> None:
        """The update on the gradients in .grad: unscaled by the gradient scaler (fp16), clipped to the recipe's
        global norm (nothing read back: clip_grad_norm_ scales on the device), the optimizer's step (the scaler
        skips it on inf or NaN, and the skip is counted on the device), the gradients cleared, the schedule moved to
        the next update."""
        scaler = self.scaler
        parts = optimizers_in(self.optimizer) if scaler is not None else []
        if scaler is not None:
            for o in parts:
                scaler.unscale_(o)
        if self.recipe.clips:
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.recipe.grad_clip)
        if scaler is None:
            self.optimizer.step()
        else:
            found = []
            for o in parts:
                scaler.step(o)
                found += list(scaler._found_inf_per_device(o).values())
            self.skipped += (torch.stack(found).sum() > 0).float()
            scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.updates += 1

    def skipped_updates(self) -> int:
        """The updates the gradient scaler skipped since the last reset (reads the device's count)."""
        return int(self.skipped.item())

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
        """Mean loss over held-out sequences (N, T), `chunk` at a time: in eval mode, under no_grad, at the step's
        precision (its autocast and, set by the caller, its matmul precision). Returned as a device tensor.

        The uncompiled model is called, so evaluating compiles nothing; every module's training flag is put back
        after (dropout that the workload switched off stays off, and compiled code finds the flags it was built
        under).
        """
        flags = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        total = torch.zeros((), device=self.device)
        try:
            with self._autocast:
                for i in range(0, len(x), chunk):
                    xs, ys = x[i:i + chunk].to(self.device), y[i:i + chunk].to(self.device)
                    _, loss = self.eager_forward(xs, ys)
                    total += loss.float() * len(xs)
        finally:
            for m, training in flags:
                m.training = training
        return total / len(x)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _, loss = self._micro_steps(x, y, True, None, 0)
        self.update()
        # A CUDA graph's output lives in its memory pool and the next replay overwrites it: keep a copy
        # (a device-side copy, no host sync).
        return loss.detach().clone() if self.spec.cudagraphs else loss.detach()
