"""The commands' own configurations, and `Settings`: everything one command line or one config file sets.

A config file (`--config FILE.toml`, and the `config.toml` every run writes beside results.json) is a Settings:
a `[run]` table (config.RunConfig, with `[run.timing]`, `[run.gates]`, ...) and a table per command
(`[race]`, `[tune]`, `[train]`, `[sweep]`, `[parallel]`, `[check]`, `[compare]`, `[judge]`). Flags override the
file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedladder import codec
from speedladder.codec import Group, at_least, int_list, option, positive, rungs_option
from speedladder.config.judge import JudgeConfig
from speedladder.config.ladders import one_precision
from speedladder.config.parallel import ParallelConfig
from speedladder.config.resolved import RESOLVED_EXTRAS
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError

# compare and check warn about a run whose base, re-timed beside a rung, moved more than this from its own measurement.
DRIFT_LIMIT = 0.10
CONFIG_FILE = "config.toml"  # beside results.json: `speedladder run --config DIR/config.toml` repeats the run
WINNER_FILE = "winner.toml"  # beside a tune's results.json: `train --config` trains the winner, `run --config` measures it


def combo_list(text: str) -> tuple[tuple[str, ...], ...]:
    """'compile+bf16,bf16+batch' -> (("compile", "bf16"), ("bf16", "batch"))."""
    import argparse

    combos = tuple(tuple(r.strip() for r in part.split("+") if r.strip()) for part in text.split(","))
    if not combos or any(not c for c in combos):
        raise argparse.ArgumentTypeError(f"give combinations as A+B,C+D, got {text!r}")
    return combos


TUNE_JUDGES = ("time", "tokens")


@dataclass(frozen=True)
class TuneConfig:
    """`speedladder tune`: the full ladder, then its surviving rungs together, within a time budget; then its
    finalists raced to a target val loss, the winner named by the time to get there."""

    budget_minutes: float = option(10.0, help="time for the whole search, the race included; work that would not "
                                              "fit is not started (the final learns-check always runs)", metavar="M",
                                   group=Group.TUNE)
    max_candidates: int = option(4, help="combinations to measure at most: the survivors together, then each left "
                                         "out in turn", metavar="N", group=Group.TUNE)
    finalists: int = option(2, help="the fastest passing configurations measured again beside eager before the "
                                    "tokens/s winner is named", metavar="N", group=Group.TUNE)
    judge: str = option("time", help="what names the winner: time, the time to the target val loss (the fastest "
                                     "passing configurations raced over seeds); tokens, tokens/s alone",
                        choices=TUNE_JUDGES, group=Group.TUNE)
    race_finalists: int = option(3, help="the fastest passing configurations by tokens/s that are raced (the "
                                         "batch rung among them under each --batch-lr-scale rule)", metavar="N",
                                 group=Group.TUNE)

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise UsageError(f"the budget must be positive, got {self.budget_minutes} minutes")
        if self.max_candidates < 0:
            raise UsageError(f"the number of candidates must be zero or more, got {self.max_candidates}")
        at_least("finalists", self.finalists, 1)
        at_least("raced finalists", self.race_finalists, 1)
        if self.judge not in TUNE_JUDGES:
            raise UsageError(f"--judge must be one of {', '.join(TUNE_JUDGES)}, got {self.judge!r}")


@dataclass(frozen=True)
class TrainConfig:
    """`speedladder train`: train one configuration, log as the source text does, validate, then sample."""

    run: str | None = option(None, help="train the winner of that folder's results.json (tune's winner, else the "
                                         "run's fastest rung), on its workload", shown="none", metavar="RUN_DIR",
                             group=Group.TRAIN)
    rungs: tuple[str, ...] | None = rungs_option(
        None, help="train the configuration these rungs compose to, applied in order without gates",
        group=Group.TRAIN, flag="--compose", was="--rungs",
        shown="eager, with a hint (--run trains a run's fastest; nothing unmeasured is trained)")
    steps: int = option(300, help="training steps", metavar="N", group=Group.TRAIN)
    log_every: int = option(10, help="log loss, step time and tokens/s every N steps", metavar="N", group=Group.TRAIN)
    eval_every: int = option(50, help="val loss on the held-out split every N steps and after the last, the clock "
                                      "stopped meanwhile; the weights at the best one are saved as best.pt; 0: none",
                             metavar="N", group=Group.TRAIN)
    sample_tokens: int = option(200, help="tokens generated after the corpus's first tokens; 0: no sample",
                                metavar="N", group=Group.TRAIN)
    prompt_tokens: int = option(16, help="the corpus's first tokens start the sample", metavar="N", group=Group.TRAIN)
    temperature: float = option(0.8, help="the sample's temperature", group=Group.TRAIN)
    top_k: int = option(20, help="sample among the k likeliest tokens; 0: all", metavar="K", group=Group.TRAIN)
    # Every 100 steps: a kill loses at most 100 steps (a third of the default 300), and on the CPU presets a save
    # costs well under 1% of the 100 steps between two (measured in docs/tune-train.md); a big model writes more.
    save_every: int = option(100, help="write checkpoint.pt (all that --resume needs) every N steps, and always "
                                       "after the last; 0: after the last only", metavar="N", group=Group.TRAIN)
    resume: str | None = option(None, help="continue that train folder from its checkpoint.pt, in the same folder, "
                                           "to its --steps, with the configuration it was trained with (its "
                                           "config.toml, under the flags given; a flag that changes the training "
                                           "is refused)", shown="none", metavar="RUN_DIR", group=Group.TRAIN)

    def __post_init__(self) -> None:
        if self.steps <= 0 or self.log_every <= 0 or self.sample_tokens < 0 or self.eval_every < 0:
            raise UsageError("--steps and --log-every must be positive, --sample-tokens and --eval-every zero or more")
        at_least("--save-every", self.save_every, 0)
        if self.run and self.rungs:
            raise UsageError("give --run or --compose, not both")
        one_precision(self.rungs or ())
        positive("the sample's temperature", self.temperature)
        at_least("top-k", self.top_k, 0)
        at_least("prompt tokens", self.prompt_tokens, 1)


# The race's seeds: paired by seed, who goes first alternating, an even number cancels a position effect in the
# mean; at the spread measured on the development CPU (docs/race.md#the-verdict), 4 find a 25% change with 80%
# power at p < 0.01. The calibration's 200 steps and evaluations every 20 keep the default race within 6 minutes
# there, cold, bf16 native or not (docs/benchmarks.md#cpu-race).
RACE_SEEDS = 4


@dataclass(frozen=True)
class RaceConfig:
    """`speedladder race`: each configuration trained to a target val loss, over seeds, judged by the time to it."""

    rungs: tuple[str, ...] | None = rungs_option(
        None, help="a cumulative ladder raced in stages: each rung composed on the best configuration so far and "
                   "raced beside it, judged against it", shown="eager,compile,bf16,batch,muon", group=Group.RACE)
    ladder: str | None = option(None, help="a named ladder raced in stages instead: speedrun (compile, bf16 and "
                                           "Muon, then modded-nanogpt's model records), source, full",
                                shown="none, i.e. --rungs", metavar="NAME", group=Group.RACE)
    combos: tuple[tuple[str, ...], ...] = option((), help="configurations of rungs composed on eager, raced in one "
                                                          "stage beside eager, each judged against it", shown="none",
                                                 metavar="A+B,C+D", parse=combo_list, group=Group.RACE)
    run: str | None = option(None, help="race that folder's winner (a tune's, else the run's fastest rung) "
                                        "against eager, on its workload", shown="none", metavar="RUN_DIR",
                             group=Group.RACE)
    stack_all: bool = option(False, help="build every rung of the ladder on the one before it, losers too (by "
                                         "default a rung that lost, or did not reach, is not built upon)",
                             group=Group.RACE)
    seeds: int = option(RACE_SEEDS, help="runs per configuration in each stage, seeds --seed, --seed+1, ...: each "
                                         "changes the initial weights and the batch order; an even number balances "
                                         "the alternating order; more raise the power", metavar="N",
                        group=Group.RACE_RULE)
    target_loss: float | None = option(None, help="the val loss to reach",
                                       shown="calibrated, eager fp32's val loss after --calibrate-steps steps on a "
                                             "seed of its own", metavar="L", group=Group.RACE_TARGET)
    target_from: str | None = option(None, help="take the target of that saved race, so that both are measured on "
                                                "one ruler (its val set and eval cadence must be this race's)",
                                     shown="none", metavar="RUN_DIR", group=Group.RACE_TARGET)
    calibrate_steps: int = option(200, help="the calibration's steps (and, with --target-loss, what the time cap is "
                                            "priced from)", metavar="N", group=Group.RACE_TARGET)
    eval_every: int = option(20, help="val loss every N base steps' worth of tokens (the clock stops meanwhile); "
                                      "the crossing is interpolated between evaluations", metavar="N",
                             flag="--eval-every-base-steps", was="--eval-every", group=Group.RACE_TARGET)
    time_cap_s: float | None = option(None, help="seconds of training after which any run that has not reached "
                                                 "the target stops (did not reach)",
                                      shown="for a base, twice --cap-factor times eager fp32's --calibrate-steps steps",
                                      metavar="S",
                                      flag="--time-cap", group=Group.RACE_TARGET)
    cap_factor: float = option(2.0, help="a run that needs more than this multiple of its base's time in the same "
                                         "seed stops there, a censored loss; a base stops at twice this multiple of "
                                         "eager fp32's --calibrate-steps steps", metavar="F", group=Group.RACE_TARGET)
    budget_steps: int | None = option(None, help="modded-nanogpt's criterion: the val loss after this many base "
                                                 "steps' worth of tokens, tested below the target (one-sample "
                                                 "t-test); each run trains at least that far; 0: off",
                                      shown="--calibrate-steps", metavar="N", group=Group.RACE_TARGET)
    # modded-nanogpt's threshold: a record must be below the target at p < 0.01.
    alpha: float = option(0.01, help="win or loss only at p below this, one-sided each way (a paired t-test by seed "
                                     "on log times)", metavar="P", group=Group.RACE_RULE)
    detect: float = option(0.10, help="a note says when the seeds cannot find a change this large with 80% power "
                                      "at --alpha", metavar="F", group=Group.RACE_RULE)

    def __post_init__(self) -> None:
        if sum(bool(x) for x in (self.rungs, self.combos, self.run)) > 1:
            raise UsageError("give one of --rungs, --combos and --run")
        for names in (self.rungs or (), *self.combos):
            one_precision(names)
        if self.target_loss is not None and self.target_from:
            raise UsageError("give --target-loss or --target-from, not both")
        if self.target_loss is not None and not (math.isfinite(self.target_loss) and self.target_loss > 0):
            raise UsageError(f"the target loss must be a positive finite number, got {self.target_loss}")
        if self.seeds < 2:
            raise UsageError(f"--seeds {self.seeds}: the verdict is a test paired by seed, and needs at least 2 seeds "
                             f"(with 2 it finds only a change of several times; {RACE_SEEDS} by default, each an "
                             "even number to balance the order)")
        for name, value in (("calibration steps", self.calibrate_steps), ("eval every", self.eval_every)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")
        if not (math.isfinite(self.cap_factor) and self.cap_factor > 1):
            raise UsageError(f"--cap-factor {self.cap_factor:g}: a run stops at this multiple of its base's time, so "
                             "it must be above 1 (2 by default)")
        at_least("the budget steps", self.budget_steps, 0)
        positive("detectable change", self.detect)
        positive("time cap", self.time_cap_s)
        if not 0 < self.alpha < 0.5:
            raise UsageError(f"the significance level must be between 0 and 0.5, got {self.alpha}")


SWEEP_AXES = (("widths", "width"), ("layers", "layers"), ("seq_lens", "seq_len"), ("batch_sizes", "batch_size"))


@dataclass(frozen=True)
class SweepConfig:
    """`speedladder sweep`: one axis and its values; the windows, gates and memory meters are the run's."""

    widths: tuple[int, ...] | None = option(None, help="model widths (n_embd); heads scaled to keep the preset's "
                                                       "head size, MLP ratio kept", shown="none (one axis is "
                                                       "required)", metavar="N,N,...", parse=int_list, group=Group.SWEEP)
    layers: tuple[int, ...] | None = option(None, help="numbers of blocks", shown="none", metavar="N,N,...",
                                            parse=int_list, group=Group.SWEEP)
    seq_lens: tuple[int, ...] | None = option(None, help="sequence lengths T (the position table grows to the "
                                                         "longest)", shown="none", metavar="N,N,...", parse=int_list,
                                              group=Group.SWEEP)
    batch_sizes: tuple[int, ...] | None = option(None, help="batch sizes B", shown="none", metavar="N,N,...",
                                                 parse=int_list, group=Group.SWEEP)
    rungs: tuple[str, ...] = rungs_option(("eager", "bf16", "compile"), help="rungs measured beside eager at every "
                                                                            "point (each on eager alone)",
                                          flag="--sweep-rungs", was="--rungs", group=Group.SWEEP)
    budget_minutes: float = option(30.0, help="a point whose estimated time does not fit in what is left is not "
                                              "started", metavar="M", group=Group.SWEEP)

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise UsageError(f"the budget must be positive, got {self.budget_minutes} minutes")
        given = [name for name, _ in SWEEP_AXES if getattr(self, name) is not None]
        if len(given) > 1:
            raise UsageError(f"one axis at a time: --{given[0].replace('_', '-')} and --{given[1].replace('_', '-')}")
        for name in given:
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise UsageError(f"--{name.replace('_', '-')} lists a value twice: {','.join(map(str, values))}")

    def axis(self) -> tuple[str, list[int]]:
        """The swept axis and its values, in order; a usage error when none is given."""
        for name, axis in SWEEP_AXES:
            if getattr(self, name) is not None:
                return axis, sorted(getattr(self, name))
        raise UsageError("one of " + ", ".join(f"--{n.replace('_', '-')}" for n, _ in SWEEP_AXES) + " is required")


@dataclass(frozen=True)
class CheckConfig:
    """`speedladder check`: a run (or race) held to a baseline, as a CI step."""

    baseline: str | None = option(None, help="the run folder (or results.json) to hold this machine to",
                                  shown="none, it is required", metavar="RUN_DIR", group=Group.CHECK)
    against: str | None = option(None, help="compare this existing run instead of running the baseline's "
                                            "configuration again", shown="run it again", metavar="NEW_RUN_DIR",
                                 group=Group.CHECK)
    keep: str | None = option(None, help="keep the new run in DIR/<timestamp>/",
                              shown="a temporary folder, removed afterwards", flag="--out", metavar="DIR",
                              group=Group.CHECK)
    tolerance: float = option(0.05, help="allowed fraction below the baseline's slowest window (a race: slower "
                                         "than the baseline's times at its alpha, by more than this)", metavar="F",
                              group=Group.CHECK)
    drift_limit: float = option(DRIFT_LIMIT, help="warn when a rung's base, re-timed beside it, ran more than this "
                                                  "fraction away from its own measurement (the machine drifted)",
                                metavar="F", group=Group.CHECK)

    def __post_init__(self) -> None:
        positive("the drift limit", self.drift_limit)
        if not 0 <= self.tolerance < 1:
            raise UsageError(f"the tolerance must be at least 0 and below 1, got {self.tolerance}")
        if self.against and self.keep:
            raise UsageError("--out keeps the re-run; with --against nothing is run")

    def require_baseline(self) -> str:
        if not self.baseline:
            raise UsageError("check needs --baseline RUN_DIR")
        return self.baseline


@dataclass(frozen=True)
class CompareConfig:
    """`speedladder compare`: its one option (the runs are its arguments)."""

    html: str | None = option(None, help="also write the comparison as a self-contained HTML page", shown="none",
                              metavar="FILE", group=Group.COMPARE)
    drift_limit: float = option(DRIFT_LIMIT, help="warn when a rung's base, re-timed beside it, ran more than this "
                                                  "fraction away from its own measurement (the machine drifted)",
                                metavar="F", group=Group.COMPARE)


@dataclass(frozen=True)
class Settings:
    """Everything a command line or a config file sets: the run, each command's own table, and --quiet."""

    run: RunConfig = option(factory=RunConfig, help="the run")
    race: RaceConfig = option(factory=RaceConfig, help="race")
    tune: TuneConfig = option(factory=TuneConfig, help="tune")
    train: TrainConfig = option(factory=TrainConfig, help="train")
    sweep: SweepConfig = option(factory=SweepConfig, help="sweep")
    parallel: ParallelConfig = option(factory=ParallelConfig, help="predict and ddp")
    check: CheckConfig = option(factory=CheckConfig, help="check")
    compare: CompareConfig = option(factory=CompareConfig, help="compare")
    judge: JudgeConfig = option(factory=JudgeConfig, help="judge")
    quiet: bool = option(False, help="no progress lines on stderr", group=Group.QUIET)
    wide: bool = option(False, help="print every column of the rung table at its full width in a terminal; to a "
                                    "file or a pipe the compact table is printed and this is ignored (report.html "
                                    "has every column)", group=Group.WIDE)


def run_from_results(config: dict[str, Any], device: str | None = None) -> RunConfig:
    """The RunConfig a results.json was made with (its "config"), whatever version wrote it: the codec, with what
    a Resolved adds beside the fields dropped and keys of other versions skipped."""
    data = {k: v for k, v in config.items() if k not in RESOLVED_EXTRAS}
    if device is not None:
        data["device"] = device
    return codec.from_data(RunConfig, data, "the saved config", unknown="skip")


def write(path: Path, settings: Settings, header: str, sections: tuple[str, ...] = ("run", "quiet")) -> Path:
    """A config file of the named sections, the header as comments; it reads back into the same Settings
    (the sections left out keep their defaults)."""
    path.write_text(codec.to_toml(settings, header, only=sections), encoding="utf-8")
    return path


def read(path: str | Path) -> dict[str, Any]:
    """A config file's data, checked against Settings (an unknown key or a wrong type is one line)."""
    data = codec.read_toml(path)
    train = data.get("train")
    if isinstance(train, dict) and "out" in train:  # a train config.toml of before train shared the run's --out
        data.setdefault("run", {}).setdefault("out", train.pop("out"))
    try:
        codec.from_data(Settings, data)
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None
    return data
