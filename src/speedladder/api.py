"""The Python API: climb the ladder on your model and your data from a script or a notebook.

    import speedladder
    results = speedladder.climb(MyModel, data="train.bin", batch_size=8, seq_len=256)
    print(results.fastest)

It does what `speedladder run` does, through the same workload and ladder, and
leaves the same files: results.json (after every rung), waterfall.png and
report.html in out/<timestamp>/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from speedladder import report, results
from speedladder.config import GateConfig, ProfileConfig, RunConfig, TimingConfig, default
from speedladder.ladder import Ladder
from speedladder.models.user import LIVE, portable
from speedladder.progress import show_on_stderr
from speedladder.records import Results
from speedladder.report.outputs import write_outputs
from speedladder.workload import prepare


def _model(model: nn.Module | Callable[[], nn.Module] | str | None) -> tuple[str | None, Any]:
    """The --model spec and the object to build from: a spec string, or an object no other process can import."""
    if model is None or isinstance(model, str):
        return model, None
    spec = portable(model)  # an importable class or function: the profiling process can build it too
    if spec is not None:
        return spec, None
    return f"{LIVE} {getattr(model, '__qualname__', type(model).__name__)}", model


def climb(model: nn.Module | Callable[[], nn.Module] | str | None = None, *, data: str | None = None,
          batch_size: int | None = None, seq_len: int | None = None, rungs: tuple[str, ...] | list[str] | None = None,
          out: str = default(RunConfig, "out"), device: str = default(RunConfig, "device"), quiet: bool = False,
          **options: Any) -> Results:
    """Climb the ladder on a model and return the typed results; the files land in out/<timestamp>/.

    model: an nn.Module (copied for every rung, its weights the initial ones), a zero-argument factory (a class
    or a function; arguments named vocab_size, block_size or seq_len get the workload's), a "FILE.py:NAME"
    string as `--model` takes, or None for the preset's GPT. A model defined in __main__ or given as an object
    cannot be imported by the profiling process: it is then climbed without a profile (results.profile says why).
    data: an embedded corpus, a text file or a FILE.bin of token ids. rungs: None climbs the default ladder.
    options: any other RunConfig field (preset, tokenizer, hf, hf_set, vocab_size, ladder, lr, seed,
    peak_tflops, ...), with timing, gates and profile as keyword dicts of TimingConfig, GateConfig and
    ProfileConfig fields, e.g. timing={"steps": 5}, profile={"enabled": False}.
    """
    spec, obj = _model(model)
    nested = {"timing": TimingConfig, "gates": GateConfig, "profile": ProfileConfig}
    for key, cls in nested.items():
        if isinstance(options.get(key), dict):
            options[key] = cls(**options[key])
    if "hf_set" in options:
        options["hf_set"] = tuple(options["hf_set"])
    run = RunConfig(model_source=spec, data=data, batch_size=batch_size, seq_len=seq_len, out=out, device=device,
                    rungs=tuple(rungs) if rungs is not None else None, **options)
    progress = show_on_stderr(quiet)
    work = prepare(run, obj)
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    run_dir = results.new_run_dir(work.cfg.run.out)
    progress(f"{work.model.name}: {work.params:,} parameters on {work.device} ({work.model.convention_line}); "
             f"writing {run_dir}")
    try:
        Ladder(work, run_dir, progress).run()
    finally:  # interrupted too: the rungs measured so far are drawn
        saved, png, page = write_outputs(run_dir)
        if not quiet:
            report.print_report(saved)
            print(f"results: {run_dir / results.FILENAME}\nwaterfall: {png}\nreport: {page}")
    return saved
