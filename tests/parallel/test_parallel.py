"""Data parallelism on this CPU: gloo, 2 processes through torchrun, the tiny preset, a few steps, no compile."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speedladder
from speedladder.cli import main
from speedladder.errors import UsageError
from speedladder.parallel import costmodel, launch
from speedladder.parallel.rank import DIE_RANK_ENV, DRIFT_RANK_ENV, FAIL_RANK_ENV

FAST = ["--preset", "tiny", "--device", "cpu", "--compose", "eager", "--window-steps", "2", "--warmup", "1", "--quiet"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(tmp: Path, *extra: str) -> dict:
    rc = main(["ddp", "--nproc", "2", *FAST, "--master-port", str(free_port()), "--out", str(tmp), *extra])
    assert rc == 0
    (run,) = tmp.iterdir()
    assert (run / "scaling.png").stat().st_size > 10_000
    page = (run / "report.html").read_text()  # the page too, its ddp section drawn from the measured job
    section = re.search(r'<section id="parallel">(.*?)</section>', page, flags=re.DOTALL)
    assert section and "<svg" in section.group(1)
    return json.loads((run / "results.json").read_text())


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> dict:
    return job(tmp_path_factory.mktemp("ddp"))


@pytest.mark.slow
def test_k1_is_measured_through_torchrun_and_efficiency_is_at_most_100_percent_or_flagged(ddp_run):
    p = ddp_run["parallel"]
    assert p["single"]["via"].startswith("torchrun, 1 process")  # like with like: the ranks' own path
    m = p["measured"]
    assert m["efficiency"] <= 1.0 or any("above 100%" in f for f in m["flags"])
    assert (m["efficiency"] > 1.0) == bool(m["flags"])


@pytest.mark.slow
def test_parameters_stay_identical_across_ranks(ddp_run):
    check = ddp_run["parallel"]["measured"]["param_check"]
    assert check["identical"] and check["max_abs_diff"] == 0.0
    assert check["params"] == ddp_run["model"]["params"]


@pytest.mark.slow
def test_tokens_per_s_is_the_whole_jobs(ddp_run):
    p = ddp_run["parallel"]
    m = p["measured"]
    per_rank = m["window_s_per_rank"]
    assert len(per_rank) == 2 and all(len(r) == 5 for r in per_rank)  # both ranks, every window
    tokens = 2 * p["tokens_per_step_per_process"] * m["steps_per_window"]  # every rank's tokens
    expected = sorted(tokens / max(a, b) for a, b in zip(*per_rank))  # over the slowest rank's time
    assert m["tokens_per_s"]["median"] == pytest.approx(expected[2])
    assert (m["tokens_per_s"]["min"], m["tokens_per_s"]["max"]) == pytest.approx((expected[0], expected[-1]))
    pred = next(r for r in p["predictions"] if r["k"] == 2)
    assert m["floor_error"] == pytest.approx(m["tokens_per_s"]["median"] / pred["floor_tokens_per_s"] - 1)


@pytest.mark.slow
def test_the_probe_measures_a_positive_finite_bandwidth(ddp_run):
    (probe,) = ddp_run["parallel"]["probes"]
    assert probe["k"] == 2 and probe["backend"] == "gloo"
    for row in probe["sizes"]:
        assert row["seconds"] > 0 and math.isfinite(row["busbw_GBps"]) and row["busbw_GBps"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # k=2: the ring factor 2(k-1)/k is 1
    bw = ddp_run["parallel"]["bandwidth"]
    assert bw["source"] == "measured"
    assert (bw["busbw_GBps"], bw["latency_us"]) == pytest.approx((probe["fit"]["busbw_GBps"],
                                                                  probe["fit"]["latency_us"]))


@pytest.mark.slow
def test_the_predictions_are_the_cost_models(ddp_run):
    p = ddp_run["parallel"]
    assert [r["k"] for r in p["predictions"]] == [1, 2, 4, 8]
    r = p["predictions"][1]
    again = costmodel.predict(2, "ddp", p["tokens_per_step_per_process"], p["single"]["tokens_per_s"]["median"],
                              p["param_bytes"], p["unit_bytes"], r["busbw_GBps"] * 1e9, r["latency_us"] * 1e-6,
                              p["bucket_cap_bytes"], p["first_bucket_bytes"], 2 / 3)
    assert r["floor_tokens_per_s"] == pytest.approx(again.floor_tokens_per_s)
    assert r["overlap_tokens_per_s"] == pytest.approx(again.overlap_tokens_per_s)
    assert p["grad_bytes"] == 4 * ddp_run["model"]["params"]


@pytest.mark.slow
def test_report_reads_the_parallel_section_back(ddp_run, tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(ddp_run))
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    m = ddp_run["parallel"]["measured"]
    # The printed table holds the saved numbers: the measured job's median and its efficiency.
    assert f"{m['tokens_per_s']['median']:,.0f}" in out and f"{100 * m['efficiency']:.0f}%" in out
    for p in ddp_run["parallel"]["predictions"]:
        assert f"{p['floor_tokens_per_s']:,.0f}" in out
    assert (tmp_path / "scaling.png").is_file()


@pytest.mark.slow
def test_fsdp_keeps_the_ranks_in_step(tmp_path):
    saved = job(tmp_path, "--strategy", "fsdp")
    p = saved["parallel"]
    assert p["strategy"] == "fsdp" and p["measured"]["param_check"]["identical"]
    assert p["predictions"][1]["messages"] == 3 + 2 + 3  # tiny: root + 2 blocks gathered, blocks again, all scattered


def _fsdp_rank(rank: int, world: int, store: str, out: str) -> None:
    """One of two gloo processes: a tiny TrainStep wrapped by FSDP2, what its params and state point at, written
    to OUT.RANK. Ends with a barrier, the group destroyed, and os._exit (gloo's threads can abort a teardown)."""
    import torch.distributed as dist

    from speedladder.config.parallel import ParallelConfig
    from speedladder.config.run import RunConfig
    from speedladder.parallel.rank import full_tensor, wrapper
    from speedladder.step.workload import prepare

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        work = prepare(RunConfig(preset="tiny", device="cpu"))
        step = work.step(work.base_spec, wrap=wrapper("fsdp", torch.device("cpu"), ParallelConfig(),
                                                      work.model.blocks_of))
        trained = {id(p) for p in step.model.parameters()}
        seen = {"params": all(id(p) in trained for p in step.params.values()),
                "sharded": all(hasattr(p, "device_mesh") for p in step.params.values()),
                "state": all(id(step.state[n]) in trained for n in step.params if n in step.state)}
        stream = work.stream(work.base_spec)
        for _ in range(2):
            step(*next(stream))
        seen["moved"] = any(not torch.equal(full_tensor(p).detach(), work.init[n]) for n, p in step.params.items())
        step.reset()  # back to the initial weights, in the shards that train
        seen["reset"] = all(torch.equal(full_tensor(p).detach(), work.init[n]) for n, p in step.params.items())
        Path(f"{out}.{rank}").write_text(json.dumps(seen))
    finally:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow
def test_fsdp2_leaves_the_steps_params_and_state_on_the_tensors_it_trains(tmp_path):
    """fully_shard puts a DTensor Parameter in place of each: TrainStep.params and .state follow, so a training step
    moves what they hold and reset() loads the initial weights into the shards (2 gloo processes)."""
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "seen")), nprocs=2)
    for rank in range(2):
        seen = json.loads((tmp_path / f"seen.{rank}").read_text())
        assert seen == {"params": True, "sharded": True, "state": True, "moved": True, "reset": True}, (rank, seen)


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_error_once(tmp_path):
    env = dict(os.environ, **{FAIL_RANK_ENV: "1"})
    env["PYTHONPATH"] = str(Path(speedladder.__file__).resolve().parent.parent)
    # The job ends instead of hanging on the failed rank (the timeout is a guard, not a measurement).
    proc = subprocess.run([sys.executable, "-m", "speedladder", "ddp", "--nproc", "2", *FAST, "--master-port",
                           str(free_port()), "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("speedladder: error: rank 1 failed: RuntimeError: injected failure on rank 1")
    assert proc.stdout.count("injected failure") == 0 and "Traceback" not in proc.stderr
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "results.json").read_text())["status"] == "failed"
    assert "Traceback" in (run / "torchrun.log").read_text()  # the whole story stays in the log


def faulty_job(tmp_path: Path, fault: str) -> subprocess.CompletedProcess:
    """`speedladder ddp --nproc 2` as a user runs it, with a fault injected on rank 1."""
    env = dict(os.environ, **{fault: "1"})
    env["PYTHONPATH"] = str(Path(speedladder.__file__).resolve().parent.parent)
    return subprocess.run([sys.executable, "-m", "speedladder", "ddp", "--nproc", "2", *FAST, "--master-port",
                           str(free_port()), "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=180, check=False)


@pytest.mark.slow
def test_a_rank_that_dies_before_it_can_speak_is_told_by_its_own_exception(tmp_path):
    proc = faulty_job(tmp_path, DIE_RANK_ENV)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "RuntimeError: injected death on rank 1" in line and "=====" not in line.split("(full log")[0], line


@pytest.mark.slow
def test_parameters_that_differ_across_ranks_fail_the_job(tmp_path):
    proc = faulty_job(tmp_path, DRIFT_RANK_ENV)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "parameters differ across ranks" in line
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "results.json").read_text())["status"] == "failed"


def test_the_allreduce_fit_recovers_latency_and_bandwidth_and_prices_every_size():
    latency, busbw, k = 50e-6, 2e9, 2
    sizes = [(n, costmodel.t_allreduce(n, k, busbw, latency)) for n in (4, 4096, 1 << 20, 25 << 20, 64 << 20)]
    fit_latency, fit_busbw = costmodel.fit_allreduce(sizes, k)
    assert fit_latency == pytest.approx(latency, rel=1e-6) and fit_busbw == pytest.approx(busbw, rel=1e-6)
    # Two points (smallest and largest) misprice a middle size when the curve is not one line; the fit is
    # judged on every size, the bucket's included.
    bent = [(n, t * (1.8 if n == 1 << 20 else 1.0)) for n, t in sizes]
    two_point = costmodel.t_allreduce(1 << 20, k, (64 << 20) / bent[-1][1] * costmodel.allreduce_factor(k),
                                      bent[0][1])
    fl, fb = costmodel.fit_allreduce(bent, k)
    fitted = costmodel.t_allreduce(1 << 20, k, fb, fl)
    assert abs(fitted / bent[2][1] - 1) < abs(two_point / bent[2][1] - 1)


@pytest.mark.slow
def test_the_job_probes_its_own_bucket_sizes(ddp_run):
    p = ddp_run["parallel"]
    (probe,) = p["probes"]
    probed = {row["bytes"] for row in probe["sizes"]}
    assert set(p["ddp_buckets"]) <= probed and p["first_bucket_bytes"] in probed
    assert probe["fit"]["busbw_GBps"] > 0 and all("fitted_seconds" in row for row in probe["sizes"])


@pytest.mark.slow
def test_predict_with_a_measured_bandwidth(tmp_path, capsys):
    assert main(["predict", "--nprocs", "2", "--measure-bandwidth", *FAST, "--master-port", str(free_port()),
                 "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    p = json.loads((run / "results.json").read_text())["parallel"]
    assert [q["k"] for q in p["probes"]] == [2] and p["probes"][0]["busbw_GBps"] > 0
    assert [r["k"] for r in p["predictions"]] == [1, 2] and p["measured"] is None
    assert "floor tok/s" in capsys.readouterr().out


@pytest.mark.slow
def test_predict_with_a_given_bandwidth_states_its_latency(tmp_path, capsys):
    assert main(["predict", "--nprocs", "4,2", "--bandwidth", "2.5", *FAST, "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    p = json.loads((run / "results.json").read_text())["parallel"]
    assert p["bandwidth"]["source"] == "given" and "assumed 20 µs (not measured)" in p["bandwidth"]["note"]
    assert [r["k"] for r in p["predictions"]] == [1, 2, 4]
    assert all(r["busbw_GBps"] == 2.5 for r in p["predictions"])
    assert "assumed 20 µs" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["ddp", "--nproc", "0"], "invalid process count: 0"),
    (["ddp", "--nproc", "two"], "invalid process count: 'two'"),
    (["ddp", "--nproc", "-2"], "invalid process count: -2"),
    (["predict", "--nprocs", "2,x", "--bandwidth", "1"], "invalid process count: 'x'"),
    (["predict", "--nprocs", "2"], "no bandwidth known for"),
    (["predict", "--nprocs", "2", "--bandwidth", "0"], "--bandwidth must be positive"),
    (["ddp", "--nproc", "2", "--compose", "eager,warp"], "unknown rung 'warp'"),
    (["ddp", "--nproc", "2", "--strategy", "zero"], "invalid choice: 'zero'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    try:
        rc = main([*argv, "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not list(tmp_path.iterdir())


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["ddp", "--nproc", "2", *FAST, "--master-port", str(port), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == (f"speedladder: error: port {port} on 127.0.0.1 is in use; "
                                       "choose another with --master-port")


def test_more_processes_than_cuda_devices_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match="more processes than this node's 1 CUDA device"):
        launch.check_nproc(2, torch.device("cuda"))
    launch.check_nproc(1, torch.device("cuda"))


def test_torchrun_gets_the_multi_node_arguments_unchanged(tmp_path):
    from speedladder.config.parallel import ParallelConfig

    cmd = launch.torchrun_command(ParallelConfig(nnodes="2", rdzv_endpoint="node0:29400", rdzv_id="job7"), 8,
                                    tmp_path / "job.json")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in ("--nproc-per-node=8", "--nnodes=2", "--rdzv-endpoint=node0:29400", "--rdzv-backend=c10d",
                "--rdzv-id=job7"):
        assert arg in cmd
    assert not any(a.startswith("--master-port") for a in cmd)
    assert cmd[-3:] == ["-m", "speedladder.parallel.rank", str(tmp_path / "job.json")]


def test_a_job_file_round_trips_a_config_that_leaves_the_rungs_to_the_ladder():
    from speedladder.codec import from_data, to_data
    from speedladder.config.run import RunConfig

    for cfg in (RunConfig(), RunConfig(ladder="full"), RunConfig(rungs=("eager", "bf16"), beside=("ckpt",))):
        assert from_data(RunConfig, json.loads(json.dumps(to_data(cfg)))) == cfg
