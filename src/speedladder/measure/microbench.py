"""Device facts measured on the spot: an operator's fixed cost, copy bandwidth, this model's own matmuls.

What the predictions need and no datasheet gives (at width 256 the products
are too small for bf16 or a bigger batch to pay). Every figure is a median of
back-to-back calls timed by torch.utils.benchmark.Timer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils import benchmark


def _time(fn: Callable[[], object], budget_s: float = 0.5, fastest: bool = False) -> float:
    """Seconds of one call of fn over blocks of back-to-back calls, as a training step runs its kernels: the
    median block's, or with fastest the fastest block's (a ceiling: another process sharing the cores can only
    slow a block down).

    torch.utils.benchmark.Timer synchronizes CUDA at block edges only and
    sizes the blocks itself; it is given this process's thread count (its
    default of one thread is not what the step runs with).
    """
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=budget_s)
    return min(m.times) if fastest else m.median


def op_floor_us(device: torch.device) -> float:
    """The fixed cost of one operator: an add of two one-element tensors."""
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    return _time(lambda: torch.add(a, b), budget_s=0.2) * 1e6


def copy_gbps(device: torch.device, n_bytes: int) -> float:
    """Bytes per second of a large tensor copy (read + write): the memory-bound ceiling, measured here."""
    x = torch.empty(n_bytes // 4, device=device)
    y = torch.empty_like(x)
    return 2 * n_bytes / _time(lambda: y.copy_(x), budget_s=0.3) / 1e9


def matmul_shapes(cfg, batch_size: int, seq_len: int) -> list[tuple[str, int, int, int, int]]:
    """The forward matmuls of one step as (name, rows, inner, cols, count); backward does each twice over."""
    rows, c, h, nh, hd = batch_size * seq_len, cfg.n_embd, cfg.mlp_hidden, cfg.n_head, cfg.head_dim
    return [
        ("qkv", rows, c, 3 * c, cfg.n_layer), ("attn-proj", rows, c, c, cfg.n_layer),
        ("mlp-fc", rows, c, h, cfg.n_layer), ("mlp-proj", rows, h, c, cfg.n_layer),
        ("head", rows, c, cfg.vocab_size, 1),
        # The hand-written attention's two batched products, one per head: (T x hd) @ (hd x T) and back.
        ("scores", batch_size * nh * seq_len, hd, seq_len, cfg.n_layer),
        ("weighted-sum", batch_size * nh * seq_len, seq_len, hd, cfg.n_layer),
    ]


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _matmul_time(rows: int, inner: int, cols: int, device: torch.device, precision: str, budget_s: float,
                 fastest: bool = False) -> float:
    """Seconds of one (rows x inner) @ (inner x cols) product (the median block's, or the fastest's: `_time`) at a
    precision: fp32, tf32 (fp32 storage, tensor-core arithmetic), bf16 or fp16 (autocast, as in the rungs: the
    casts of fp32 inputs are part of what they cost), or fp8 (e4m3 operands, one scale each, a bf16 product:
    torch._scaled_mm, the product under torchao's float8 linears)."""
    x = torch.randn(rows, inner, device=device)
    w = torch.randn(cols, inner, device=device)
    if precision == "fp8":
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        return _time(lambda: torch._scaled_mm(x8, w8.t(), one, one, out_dtype=torch.bfloat16), budget_s, fastest)
    before = torch.get_float32_matmul_precision()  # process-wide: set for this product and put back
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        with torch.autocast(device.type, dtype=AUTOCAST.get(precision, torch.bfloat16),
                            enabled=precision in AUTOCAST):
            return _time(lambda: F.linear(x, w), budget_s, fastest)
    finally:
        torch.set_float32_matmul_precision(before)


def ceiling_side(device: torch.device) -> int:
    """The side n of the n x n x n matmul whose throughput is taken as a device's ceiling: 4096 on a GPU, big
    enough to fill one; 512 elsewhere, where a CPU reaches its rate well below that and a bigger product
    takes seconds."""
    return 4096 if device.type == "cuda" else 512


def matmul_ceiling(device: torch.device, precision: str, side: int, budget_s: float) -> float:
    """TFLOP/s of an n x n x n matmul at a precision, its fastest block of back-to-back products: the matmul
    ceiling of this device, measured on the spot (the roofline's compute roof, and the MFU peak of a device
    with no datasheet entry)."""
    return 2 * side**3 / _matmul_time(side, side, side, device, precision, budget_s, fastest=True) / 1e12


def matmul_facts(cfg, batch_size: int, seq_len: int, multiplier: int, device: torch.device,
                 ceiling_n: int, budget_s: float = 4.0) -> dict:
    """Throughput of this model's own matmul shapes in fp32 and bf16, at the batch and at multiplier x it.

    What the bf16 and batch-up predictions need and no datasheet gives: at
    width 256 the products are too small for bf16 or a bigger batch to pay.
    A shape too slow for the budget is left out (named in "skipped").
    """
    shapes = matmul_shapes(cfg, batch_size, seq_len)
    padded = -cfg.vocab_size % 64  # what pad-vocab would add to the head
    per_call = budget_s / (4 * len(shapes) + 2 * bool(padded) + 2)
    ceiling = {prec: matmul_ceiling(device, prec, ceiling_n, per_call) for prec in ("fp32", "bf16")}
    out: dict = {"ceiling_tflops": ceiling, "ceiling_n": ceiling_n, "shapes": [], "skipped": [],
                 "multiplier": multiplier}
    if padded:
        shapes.append(("head-padded", batch_size * seq_len, cfg.n_embd, cfg.vocab_size + padded, 1))
    for name, rows, inner, cols, count in shapes:
        flops = 2 * rows * inner * cols
        if flops * multiplier / (min(ceiling.values()) * 1e12) > per_call:
            out["skipped"].append(name)
            continue
        runs: tuple[tuple[str, int, str], ...] = (("fp32", rows, "fp32"), ("bf16", rows, "bf16"))
        if name != "head-padded":
            runs += (("fp32_k", rows * multiplier, "fp32"), ("bf16_k", rows * multiplier, "bf16"))
        try:
            times = {key: _matmul_time(r, inner, cols, device, prec, per_call) * count for key, r, prec in runs}
        except RuntimeError as e:  # out of memory, e.g. GPT-2's head at the batch-up multiple on a smaller GPU
            if "out of memory" not in str(e).lower() and "can't allocate" not in str(e):
                raise
            out["skipped"].append(name)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        out["shapes"].append({"name": name, "rows": rows, "inner": inner, "cols": cols, "count": count,
                              **{f"{k}_ms": v * 1e3 for k, v in times.items()}})

    def total(key: str, names: tuple[str, ...] | None = None) -> float:
        return sum(s[f"{key}_ms"] for s in out["shapes"] if s["name"] != "head-padded"
                   and (names is None or s["name"] in names))

    # Time-weighted over the shapes (each counted as often as the step runs it), as they weigh in the step.
    t32, t16 = total("fp32"), total("bf16")
    out["bf16_speedup"] = t32 / t16 if t16 else None
    out["batch_gain"] = {p: multiplier * total(p) / total(f"{p}_k") if total(f"{p}_k") else None
                         for p in ("fp32", "bf16")}
    # The hand-written attention's share of the matmul time: what fused attention takes over.
    out["attention_fraction"] = {p: total(p, ("scores", "weighted-sum")) / total(p) if total(p) else 0.0
                                 for p in ("fp32", "bf16")}
    head = next((s for s in out["shapes"] if s["name"] == "head"), None)
    head_padded = next((s for s in out["shapes"] if s["name"] == "head-padded"), None)
    out["head_fraction"] = {p: head[f"{p}_ms"] / total(p) if head and total(p) else 0.0 for p in ("fp32", "bf16")}
    out["pad_vocab_speedup"] = ({p: head[f"{p}_ms"] / head_padded[f"{p}_ms"] for p in ("fp32", "bf16")}
                                if head and head_padded else None)
    return out
