"""A StepSpec made real: model, optimizer, precision and compilation.

A TrainStep call does one whole training step (host batch -> device copy ->
forward -> loss -> backward -> AdamW update) and returns the loss as a device
tensor, never a Python number: reading it would synchronize the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from speedladder import models
from speedladder.config import MuonConfig
from speedladder.model import GPTConfig
from speedladder.models import ModelDef
from speedladder.optim import MuonAdamW, is_hidden_matrix, muon_optimizer
from speedladder.rungs import StepSpec


@contextlib.contextmanager
def matmul_precision(spec: StepSpec) -> Iterator[None]:
    """TF32 is process-wide state: set it for one rung and put it back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if spec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def model_def(model: ModelDef | GPTConfig) -> ModelDef:
    """A ModelDef; our GPT's config becomes the ModelDef of our GPT."""
    return model if isinstance(model, ModelDef) else models.ours(model)


def initial_state(model: ModelDef | GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The weights every rung starts from, on the host, so each rung sees the same model."""
    return models.initial_state(model_def(model), seed)


class TrainStep:
    def __init__(self, spec: StepSpec, model: ModelDef | GPTConfig, init: dict[str, torch.Tensor],
                 device: torch.device, lr: float, wrap: Callable[[nn.Module], nn.Module] | None = None,
                 muon: MuonConfig | None = None) -> None:
        self.spec = spec
        self.source = model_def(model)
        self.device = device
        self.lr = lr
        self.muon = muon or MuonConfig()
        self.init = init
        model = self.source.build(device)  # dropout off: two runs of one step compute the same
        model.load_state_dict(init)
        # Parameters by their reference names, taken before any transform renames modules.
        self.params = dict(model.named_parameters())
        # Their reference shapes: a transform may grow a parameter in place (pad-vocab adds rows at the end).
        self.shapes = {n: p.shape for n, p in self.params.items()}
        # Every entry of the plain model's state dict (a tied matrix under each of its names), for checkpoints.
        self.state = model.state_dict(keep_vars=True)
        self.model = model
        for name in spec.transforms:
            self.model = self.source.transform(name)(self.model)
        # A transform may grow a parameter in place, never swap in a new one: reset() and the gates would miss it.
        ours = {id(p) for p in self.params.values()}
        if any(id(p) not in ours for p in self.model.parameters()):
            raise RuntimeError(f"a model transform of {spec.transforms} made new parameter objects")
        if wrap is not None:  # e.g. DistributedDataParallel: after the transforms, before compilation
            self.model = wrap(self.model)
        # Called in its own convention, answering (logits, loss) with one loss for every model (models/base.py).
        adapted = self.source.adapter(self.model)
        self.eager_forward = adapted  # uncompiled: what evaluation calls, so no eval graph is compiled
        # dynamic=False: one fixed shape per rung; a shape change must recompile, and is counted.
        self.forward = (torch.compile(adapted, dynamic=False, mode=spec.compile_mode) if spec.compile
                        else adapted)
        self.optimizer = self._new_optimizer()
        self._autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                                        enabled=spec.autocast == "bf16")

    @property
    def vocab_size(self) -> int:
        """The real vocabulary (a padded head has more rows): what the gates compare."""
        return self.source.vocab_size

    def _new_optimizer(self) -> torch.optim.Optimizer | MuonAdamW:
        opt = self.spec.optimizer
        if opt == "muon":
            prefix = self.source.blocks_prefix or "blocks."
            hidden = [p for n, p in self.params.items() if is_hidden_matrix(n, p, prefix)]
            rest = [p for n, p in self.params.items() if not is_hidden_matrix(n, p, prefix)]
            m, scale = self.muon, self.spec.lr_scale
            return MuonAdamW(muon_optimizer(hidden, lr=m.lr * scale, momentum=m.momentum, nesterov=m.nesterov,
                                            ns_steps=m.ns_steps),
                             torch.optim.AdamW(rest, lr=self.lr * scale))
        if opt not in ("adamw", "adamw-fused", "adamw-foreach"):
            raise ValueError(f"unknown optimizer {opt!r}")
        # Plain "adamw" leaves the implementation to torch's default; the others ask for one.
        kind = {"adamw-fused": {"fused": True}, "adamw-foreach": {"foreach": True}}.get(opt, {})
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr * self.spec.lr_scale, **kind)

    def reference_part(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The part of a (possibly padded) parameter or gradient that is the reference parameter."""
        rows = self.shapes[name][0] if self.shapes[name] else None
        return t if rows is None or t.shape[0] == rows else t[:rows]

    def reference_state(self) -> dict[str, torch.Tensor]:
        """The state under the reference names and shapes, on the host: loadable into the plain model."""
        return {k: (t[: self.init[k].shape[0]] if t.ndim and t.shape[0] != self.init[k].shape[0] else t)
                .detach().cpu().clone() for k, t in self.state.items()}

    def reset(self, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Back to the initial weights (or the given ones) with a fresh optimizer; compiled code is kept."""
        weights = self.init if weights is None else weights
        with torch.no_grad():
            for name, p in self.params.items():
                if p.shape != self.shapes[name]:
                    p.zero_()  # padding rows back to zero
                self.reference_part(name, p).copy_(weights[name])
                p.grad = None
        self.optimizer = self._new_optimizer()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Logits (None from a model whose forward returns a loss only) and loss of one batch, gradients left in
        .grad; no update."""
        if self.spec.cudagraphs:
            # A new iteration for CUDA graph trees: the previous step's graph outputs may be overwritten now.
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast:
            logits, loss = self.forward(x, y)
        loss.backward()
        return logits, loss

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
        _, loss = self.forward_backward(x, y)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # A CUDA graph's output lives in its memory pool and the next replay overwrites it: keep a copy
        # (a device-side copy, no host sync).
        return loss.detach().clone() if self.spec.cudagraphs else loss.detach()
