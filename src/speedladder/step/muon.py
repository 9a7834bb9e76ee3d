"""Muon: momentum orthogonalized by a Newton-Schulz iteration, for the hidden weight matrices.

torch.optim.Muon (PyTorch >= 2.9) is used wherever the installed torch has it
(`muon_optimizer`); the implementation below is the fallback for older torch,
and a test checks that the two give the same update where both exist.

Written here from Keller Jordan's published description (2024, "Muon: An
optimizer for hidden layers in neural networks"): keep SGD momentum (Nesterov),
replace each 2-D update by the nearest semi-orthogonal matrix U V^T of its SVD
U S V^T, approximated by five steps of a quintic Newton-Schulz iteration whose
coefficients push every singular value quickly into a band around 1, and scale
it by sqrt(max(1, rows/cols)). Embeddings, the output head, norms and biases
are not hidden matrices: they stay with AdamW (`MuonAdamW`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from speedladder import processor

# The quintic's coefficients from the published algorithm: chosen for a steep slope at 0, not for convergence
# to exactly 1; after five steps the singular values lie roughly within [0.7, 1.2], which is what Muon needs.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: torch.Tensor, steps: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An approximation of U V^T for g = U S V^T (2-D), by a quintic Newton-Schulz iteration."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide orientation: X X^T is the smaller square
        x = x.mT
    x = x / (x.norm() + 1e-7)  # spectral norm <= Frobenius norm <= 1: inside the iteration's basin
    for _ in range(steps):
        s = x @ x.mT  # (rows, rows)
        x = a * x + (b * s + c * s @ s) @ x
    if tall:
        x = x.mT
    return x.to(g.dtype)


class Muon(torch.optim.Optimizer):
    """SGD momentum whose 2-D updates are orthogonalized; no host synchronization."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float, nesterov: bool,
                 ns_steps: int, ns_dtype: torch.dtype = torch.float32) -> None:
        params = list(params)
        if any(p.ndim != 2 for p in params):
            raise ValueError("Muon takes 2-D weight matrices only; give the rest to AdamW")
        self.ns_dtype = ns_dtype  # the Newton-Schulz iteration's dtype (processor.ns_dtype_for)
        super().__init__(params, {"lr": lr, "momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps})

    @torch.no_grad()
    def step(self, closure=None) -> None:  # type: ignore[override]  # closure never called: no loss to return
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(p.grad)
                update = p.grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_steps"], self.ns_dtype)
                scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
                p.add_(update, alpha=-group["lr"] * scale)


def muon_optimizer(params: list[torch.nn.Parameter], lr: float, momentum: float, nesterov: bool,
                   ns_steps: int) -> torch.optim.Optimizer:
    """Muon with its iteration in the dtype the parameters' device runs natively (processor.ns_dtype_for): torch.optim.Muon
    (no weight decay, as the fallback) for bf16 where torch has it, else ours."""
    dtype, _ = processor.ns_dtype_for(params[0].device if params else torch.device("cpu"))
    if dtype == torch.bfloat16 and hasattr(torch.optim, "Muon"):
        return torch.optim.Muon(params, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                ns_coefficients=NS_COEFFICIENTS, weight_decay=0.0)
    return Muon(params, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_dtype=dtype)


class MuonAdamW:
    """Muon for the hidden matrices, AdamW for everything else; steps and clears both."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon = muon
        self.adamw = adamw

    @property
    def state(self) -> dict:
        return {**self.muon.state, **self.adamw.state}

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, dict]:
        """Both optimizers' states, for a checkpoint to continue from."""
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def is_hidden_matrix(name: str, p: torch.nn.Parameter, prefix: str = "blocks.") -> bool:
    """A 2-D weight inside a block (under `prefix`, the model's repeated blocks): what Muon is for."""
    return p.ndim == 2 and name.startswith(prefix)
