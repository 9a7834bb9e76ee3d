"""The `predict` and `ddp` commands: their flags (defaults from ParallelConfig) and their thin bodies."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedladder import results
from speedladder.cli.flags import add_output_flags, add_rung_flags, add_workload_flags, run_config
from speedladder.config import RunConfig, default
from speedladder.parallel import launch
from speedladder.parallel.config import STRATEGIES, ParallelConfig
from speedladder.progress import show_on_stderr
from speedladder.report import html as html_report
from speedladder.report import parallel as parallel_report


def _nproc(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid process count: {text!r} (a whole number of at least 1)") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"invalid process count: {k} (at least 1)")
    return k


def _nproc_list(text: str) -> tuple[int, ...]:
    ks = tuple(_nproc(t.strip()) for t in text.split(",") if t.strip())
    if not ks:
        raise argparse.ArgumentTypeError("no process count given")
    return tuple(sorted(set(ks)))


def _torchrun_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("torchrun", "passed through to torchrun unchanged (multi-node: run the same command "
                                         "on every node with its --node-rank, or with --rdzv-endpoint)")
    g.add_argument("--nnodes", default=default(ParallelConfig, "nnodes"), help="nodes. Default: %(default)s")
    g.add_argument("--node-rank", type=int, default=default(ParallelConfig, "node_rank"),
                   help="this node's rank (static rendezvous). Default: %(default)s")
    g.add_argument("--master-addr", default=default(ParallelConfig, "master_addr"),
                   help="address of node 0 (static rendezvous). Default: %(default)s")
    g.add_argument("--master-port", type=int, default=default(ParallelConfig, "master_port"),
                   help="port on node 0; checked free before the launch. Default: %(default)s")
    g.add_argument("--rdzv-endpoint", default=default(ParallelConfig, "rdzv_endpoint"), metavar="HOST:PORT",
                   help="dynamic rendezvous endpoint (replaces --master-addr/--master-port). Default: none")
    g.add_argument("--rdzv-backend", default=default(ParallelConfig, "rdzv_backend"),
                   help="rendezvous backend with --rdzv-endpoint. Default: c10d")
    g.add_argument("--rdzv-id", default=default(ParallelConfig, "rdzv_id"),
                   help="job id shared by the nodes, with --rdzv-endpoint. Default: torchrun's")


def _common(p: argparse.ArgumentParser) -> None:
    add_workload_flags(p)
    add_rung_flags(p)
    p.add_argument("--strategy", choices=STRATEGIES, default=default(ParallelConfig, "strategy"),
                   help="ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard per block and the root. "
                        "Default: %(default)s")
    p.add_argument("--bucket-cap-mb", type=float, default=default(ParallelConfig, "bucket_cap_mb"), metavar="MB",
                   help="DDP bucket size in MiB. Default: %(default)s")
    add_output_flags(p)
    _torchrun_flags(p)


def add_commands(sub) -> None:
    predict = sub.add_parser(
        "predict", help="price data parallelism for k processes before launching it",
        description="Measure one process's tokens/s for the chosen rungs, get the allreduce bandwidth, and print "
                    "for each k the gradient bytes, t_comm, t_compute, the no-overlap floor, an overlap-aware "
                    "estimate and the scaling efficiency.")
    _common(predict)
    predict.add_argument("--nproc", type=_nproc_list, default=default(ParallelConfig, "predict_nproc"),
                         metavar="K,K,...", help="process counts to price. Default: "
                         + ",".join(map(str, default(ParallelConfig, "predict_nproc"))))
    bw = predict.add_mutually_exclusive_group()
    bw.add_argument("--bandwidth", type=float, metavar="GBps",
                    help="bus bandwidth (nccl-tests' busbw) in GB/s. Default: measured with --measure-bandwidth, "
                         "else a datasheet NVLink figure on known GPUs (labelled as assumed), else required")
    bw.add_argument("--measure-bandwidth", action="store_true",
                    help="run an allreduce probe over k processes (torchrun) for each k; its busbw and latency "
                         "feed the cost model")
    predict.add_argument("--latency-us", type=float, metavar="US",
                         help="per-message latency in µs with --bandwidth. Default: measured with --measure-bandwidth,"
                              f" else assumed {default(ParallelConfig, 'assumed_latency_us'):g}")

    ddp = sub.add_parser(
        "ddp", help="launch k processes with torchrun and compare measured tokens/s with the prediction",
        description="Measure one process, then launch K processes through torchrun (NCCL on CUDA, gloo on the "
                    "CPU): an allreduce probe, the prediction, then the same timed windows as `run` for the whole "
                    "job; results.json (`parallel`) and scaling.png.")
    _common(ddp)
    ddp.add_argument("--nproc", type=_nproc, default=default(ParallelConfig, "nproc"), metavar="K",
                     help="processes per node (one per GPU on CUDA). Default: %(default)s")


def _configs(args: argparse.Namespace, nproc: int) -> tuple[RunConfig, ParallelConfig]:
    run = run_config(args)
    pcfg = ParallelConfig(
        strategy=args.strategy, nproc=nproc, bucket_cap_mb=args.bucket_cap_mb, nnodes=args.nnodes,
        node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
        rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
    return run, pcfg


def _finish(run_dir: Path) -> None:
    saved = results.load(run_dir)
    parallel_report.print_parallel(saved)
    png = parallel_report.plot(saved, run_dir / parallel_report.SCALING_PLOT)
    print(f"results: {run_dir / results.FILENAME}\nplot: {png}\nreport: {html_report.write(saved, run_dir)}")


def cmd_predict(args: argparse.Namespace) -> int:
    run, pcfg = _configs(args, default(ParallelConfig, "nproc"))
    pcfg = ParallelConfig(**{**pcfg.__dict__, "predict_nproc": args.nproc})
    run_dir = launch.run_predict(run, pcfg, list(args.nproc), args.bandwidth, args.measure_bandwidth,
                                   args.latency_us, show_on_stderr(args.quiet))
    _finish(run_dir)
    return 0


def cmd_ddp(args: argparse.Namespace) -> int:
    run, pcfg = _configs(args, args.nproc)
    run_dir = launch.run_ddp(run, pcfg, show_on_stderr(args.quiet))
    if run_dir is None:
        print("this node's ranks finished; rank 0 ran on another node, whose run folder holds the results")
        return 0
    _finish(run_dir)
    return 0
