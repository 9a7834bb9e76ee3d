"""The `parallel` section of results.json: what is priced, the predictions, and the job's measurement.

Shared by the parent (predict, ddp) and every torchrun rank (parallel/rank.py),
so it holds no launch code: pure arithmetic over costmodel and the records.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from speedladder.config.parallel import ParallelConfig
from speedladder.measure import judging
from speedladder.parallel import costmodel
from speedladder.records import Results, from_dict
from speedladder.records.parallel_section import Bandwidth, KPrediction, MeasuredJob, ParallelSection, ParamCheck, Probe
from speedladder.spec import StepSpec
from speedladder.step.workload import Workload

DDP_DEFAULT_BUCKET_MB = 25.0  # torch's DistributedDataParallel default bucket_cap_mb


def model_bytes(work: Workload) -> tuple[list[int], list[int]]:
    """fp32 gradient bytes per parameter tensor (registration order) and per FSDP unit (root first, blocks)."""
    try:
        model = work.model.build(torch.device("meta"))  # shapes only, no memory
    except Exception:  # noqa: BLE001 -- a model that cannot be built on the meta device is built on the host
        model = work.model.build(torch.device("cpu"))
    per_param = [costmodel.grad_bytes(p.numel()) for p in model.parameters()]
    blocks = [sum(costmodel.grad_bytes(p.numel()) for p in b.parameters()) for b in work.model.blocks_of(model)]
    return per_param, [sum(per_param) - sum(blocks), *blocks]


def new_section(work: Workload, spec: StepSpec, pcfg: ParallelConfig, command: str, ks: list[int],
                threads: int, cores: int | None) -> ParallelSection:
    """What predict and ddp price: the model's gradient bytes, buckets and units, before anything is measured."""
    per_param, units = model_bytes(work)
    cap = int(pcfg.bucket_cap_mb * costmodel.MIB)
    first = int(pcfg.first_bucket_mb * costmodel.MIB) if pcfg.bucket_cap_mb == DDP_DEFAULT_BUCKET_MB else cap
    return ParallelSection(
        command=command, strategy=pcfg.strategy, nproc=ks, threads_per_process=threads, cpu_cores=cores,
        config=pcfg, spec=spec, rungs=list(work.cfg.run.rungs or ()),
        tokens_per_step_per_process=spec.tokens_per_step, grad_bytes=sum(per_param), param_bytes=per_param,
        unit_bytes=units, bucket_cap_bytes=cap, first_bucket_bytes=first,
        ddp_buckets=costmodel.ddp_buckets(per_param, cap, first))


def price(section: ParallelSection, ks: list[int]) -> list[KPrediction]:
    """Predictions for every k from the single-process tokens/s and the section's bandwidth figures."""
    bw, single = section.bandwidth, section.single
    assert bw is not None and single is not None and bw.busbw_GBps is not None and bw.latency_us is not None
    by_k = {p.k: p for p in section.probes}
    out = []
    for k in ks:
        probe = by_k.get(k) if bw.source == "measured" else None
        busbw = probe.busbw_GBps if probe and probe.busbw_GBps is not None else bw.busbw_GBps
        latency_us = probe.latency_us if probe and probe.latency_us is not None else bw.latency_us
        p = costmodel.predict(k, section.strategy, section.tokens_per_step_per_process, single.tokens_per_s.median,
                              section.param_bytes, section.unit_bytes, busbw * 1e9, latency_us * 1e-6,
                              section.bucket_cap_bytes, section.first_bucket_bytes,
                              section.config.backward_fraction)
        out.append(KPrediction(**dataclasses.asdict(p), busbw_GBps=busbw, latency_us=latency_us,
                               from_probe_k=probe.k if probe else bw.probe_k))
    return out


def record_probe(section: ParallelSection, saved_probe: dict) -> None:
    """A ddp job's own probe (as the worker made it): its figures price the job (and, extrapolated, other k)."""
    probe = from_dict(Probe, saved_probe)
    section.probes = [probe]
    if probe.busbw_GBps is None:  # one process: nothing to reduce, nothing to measure
        section.bandwidth = Bandwidth(source="none", busbw_GBps=None, latency_us=probe.latency_us, probe_k=1,
                                      note="one process: no communication to price")
        section.predictions = [dataclasses.replace(single_prediction(section), from_probe_k=1)]
        return
    section.bandwidth = Bandwidth(source="measured", busbw_GBps=probe.busbw_GBps, latency_us=probe.latency_us,
                                  probe_k=probe.k,
                                  note=f"allreduce probe over this job's {probe.backend} group, k={probe.k}")
    ks = sorted({1, probe.k, *section.config.predict_nproc})
    section.predictions = price(section, ks)


def single_prediction(section: ParallelSection) -> KPrediction:
    """k = 1 priced: the single process's own tokens/s, no communication."""
    assert section.single is not None
    single = section.single.tokens_per_s.median
    tc = costmodel.t_compute(section.tokens_per_step_per_process, single)
    return KPrediction(k=1, strategy=section.strategy, comm_bytes=0, messages=0, t_compute_s=tc, t_comm_s=0.0,
                       t_exposed_s=0.0, floor_tokens_per_s=single, overlap_tokens_per_s=single, floor_efficiency=1.0,
                       overlap_efficiency=1.0)


def prediction_lines(section: ParallelSection) -> list[str]:
    lines = []
    for p in section.predictions:
        lines.append(f"predicted k={p.k}: floor {p.floor_tokens_per_s:,.0f} tokens/s, overlap-aware "
                     f"{p.overlap_tokens_per_s:,.0f} ({100 * p.overlap_efficiency:.0f}% efficiency)")
    return lines


def job_tokens_per_s(window_s_per_rank: list[list[float]], steps: int, tokens_per_step: int) -> list[float]:
    """Per window, the whole job's tokens/s: every rank's tokens over the slowest rank's window time."""
    k = len(window_s_per_rank)
    return [costmodel.tokens_per_s(k, tokens_per_step, max(col) / steps) for col in zip(*window_s_per_rank)]


def record_measured(saved: Results, measured: dict, world: int) -> None:
    section = saved.parallel
    assert section is not None
    timing = measured["timing"]
    steps = timing["windows"][0]["steps"]
    rates = job_tokens_per_s(measured["window_s_per_rank"], steps, section.tokens_per_step_per_process)
    clean = [r for r, w in zip(rates, timing["windows"]) if w["recompiles"] == 0]
    if not clean:
        raise RuntimeError("every timed window of the job recompiled: no valid window")
    spread = judging.Spread(statistics.median(clean), min(clean), max(clean))
    pred = section.prediction(world)
    assert section.single is not None
    efficiency = costmodel.efficiency(spread.median, world, section.single.tokens_per_s.median)
    flags = [] if efficiency <= 1 else [
        (f"efficiency {efficiency:.0%} is above 100%: k processes cannot beat k times one; a measurement mismatch "
         "(the one-process run and the job differ in something other than k), not a result")]
    section.measured = MeasuredJob(
        k=world, tokens_per_s=spread, param_check=from_dict(ParamCheck, measured["param_check"]),
        efficiency=efficiency,
        floor_error=costmodel.relative_error(spread.median, pred.floor_tokens_per_s) if pred else None,
        overlap_error=costmodel.relative_error(spread.median, pred.overlap_tokens_per_s) if pred else None,
        flags=flags,
        extra={"window_tokens_per_s": rates, "window_s_per_rank": measured["window_s_per_rank"],
               "steps_per_window": steps, "timing_rank0": timing})
    saved.status = "complete"


