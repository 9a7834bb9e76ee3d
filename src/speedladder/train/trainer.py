"""`speedladder train`: train one configuration, log like the source text, sample text, save checkpoints.

The configuration is a tuned or measured winner (`--run RUN_DIR`, or
`--config winner.toml`), the spec that `--compose` gives, or by default eager,
with a one-line hint: a composition nobody measured is never trained.

A checkpoint holds what continuing needs (the optimizer's state, the step,
the batch stream's position, the generators' states), so `--resume RUN_DIR`
takes a run on from its last one, to the loss curve it would have had.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedladder import codec
from speedladder.config import settings
from speedladder.config.settings import Settings, TrainConfig
from speedladder.data.batches import BatchStream
from speedladder.data.tokenizers import get_tokenizer
from speedladder.errors import UsageError
from speedladder.measure import devicemem
from speedladder.models import build
from speedladder.models.gpt import GPT, GPTConfig
from speedladder.models.model_record import ModelRecord
from speedladder.records import storage
from speedladder.rungs import RUNGS, compose
from speedladder.spec import StepSpec
from speedladder.step.schedule import Span
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, prepare

CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"  # the weights at the lowest val loss


# What `train` with no configuration named says: it trains eager, the one configuration measured by definition.
NO_CONFIGURATION = ("no configuration named: training eager; `speedladder train --run RUN_DIR` trains the fastest "
                    "configuration a run measured, --config winner.toml a tune's winner")


def plan(s: Settings) -> tuple[Workload, StepSpec, str]:
    """The workload and the spec to train, and a phrase saying where the spec came from: the winner of --run
    (whose saved workload the command line has put under the flags; eager when nothing there paid, said), --compose,
    or eager when neither is given."""
    t = s.train
    if t.run:
        won = storage.load(t.run).winner()
        if won is None:
            raise UsageError(f"{t.run} names no configuration that passed every gate")
        name, names = won
        source = f"{name} from {t.run}" + ("" if names else " (nothing there paid: its fastest is eager)")
    else:  # given rungs (an empty list: eager alone, a winner that was eager)
        names = tuple(n for n in t.rungs or () if n != "eager")
        source = "--compose " + ",".join(t.rungs or ("eager",)) if t.rungs is not None else "eager"
    work = _checked(prepare(s.run.with_rungs(("eager", *names))), t)
    work.with_horizon(Span(t.steps, "steps"))  # the schedule, unless the recipe gives its length, is the training's
    for n in names:
        why = RUNGS[n].requires.unmet(work.env)
        if why:
            raise UsageError(f"rung {n} cannot run here: {why}")
    return work, compose(names, work.base_spec, work.env), source


def _checked(work: Workload, t: TrainConfig) -> Workload:
    """A val split that can be evaluated, when train evaluates: refused before any step is taken."""
    if t.eval_every:
        work.val_set(work.cfg.seq_len)
    return work


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[nn.Module, dict]:
    """A saved checkpoint as the plain model (our GPT, the Hugging Face model or the user's own, without the rungs'
    transforms) and the rest of what was saved."""
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = GPT(GPTConfig(**ckpt["config"])) if ckpt.get("config") else build.rebuild(ModelRecord.from_dict(ckpt["model_def"]))
    model.load_state_dict(ckpt["model"])
    return model, ckpt


@dataclass
class Trained:
    """What a training run leaves (and a checkpoint saves on the way): the weights, every loss, and the val curve
    with its best point."""

    state: dict[str, torch.Tensor]  # the weights at the last save (the final ones at the end), reference names
    losses: list[float]
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, val loss) at every evaluation
    best_state: dict[str, torch.Tensor] | None = None  # the weights at the lowest val loss, until best.pt holds them
    best_step: int | None = None
    best_val: float | None = None
    best_seconds: float | None = None  # the training clock there: steps only, evaluations excluded
    train_seconds: float = 0.0
    start: int = 0  # the step it began at: 0, or that of the checkpoint it resumed from


# What may differ when a run is resumed: how it logs, saves and samples, and where a new run would have gone.
# Everything else decides the loss curve or what is saved beside it, and must be as it was.
# (train.out: in a checkpoint of before train took the run's --out.)
FREE_ON_RESUME = ("train.resume", "train.out", "train.log_every", "train.save_every", "train.sample_tokens",
                  "train.prompt_tokens", "train.temperature", "train.top_k", "run.out")


def save_atomically(obj: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file in the same folder, on disk, then renamed over `path`: a kill at any moment
    leaves the previous file whole, or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes on disk before the rename makes them the checkpoint
    os.replace(tmp, path)


def rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    """The global generators' states: torch's on the host and on the training device. Batches come from the
    stream's own generator and dropout is off, so our training draws from neither, nor from Python's or numpy's
    (which nothing here uses); a model's own forward may draw from torch's."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict[str, torch.Tensor | None], device: torch.device) -> None:
    if state["torch"] is not None:
        torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


@dataclass
class Checkpoints:
    """checkpoint.pt every `every` steps and at the end, and before it best.pt when the val loss has improved since
    the last save (so the checkpoint never names a best that best.pt lacks), each written atomically."""

    run_dir: Path
    every: int  # 0: at the end only
    meta: dict[str, Any]  # what every checkpoint holds that training does not change

    def due(self, done: int) -> bool:
        return self.every > 0 and done % self.every == 0

    def save(self, out: Trained, step: TrainStep, stream: BatchStream, done: int) -> None:
        common = {**self.meta, "step": done, "losses": list(out.losses), "val": list(out.val),
                  "best_step": out.best_step, "best_val": out.best_val, "best_seconds": out.best_seconds,
                  "created": storage.now()}
        if out.best_state is not None:
            save_atomically({"model": out.best_state, **common}, self.run_dir / BEST)
            out.best_state = None
        optimizer = getattr(step.optimizer, "state_dict", None)  # a rung's own optimizer may have none
        save_atomically({"model": out.state, **common, "resume": {
            "optimizer": optimizer() if optimizer else None, "beyond": step.beyond_reference(),
            "stream": stream.state(), "rng": rng_state(step.device), "train_seconds": out.train_seconds,
            "updates": step.updates, "scaler": step.scaler.state_dict() if step.scaler is not None else None}},
            self.run_dir / CHECKPOINT)


def continued(ckpt: dict[str, Any], step: TrainStep, stream: BatchStream) -> Trained:
    """A run as its checkpoint left it, put back: the parameters and the optimizer, the batch stream's position and
    the generators, what it had logged and its best val loss so far (best.pt already holds those weights)."""
    r = ckpt["resume"]
    # The schedule goes on from the update it had reached (a checkpoint of before the recipe: its step), the
    # gradient scaler from its scale.
    step.restore(ckpt["model"], r["beyond"], r["optimizer"], r.get("updates", ckpt["step"]), r.get("scaler"))
    stream.load_state(r["stream"])
    set_rng_state(r["rng"], step.device)
    return Trained(ckpt["model"], list(ckpt["losses"]), [(int(s), float(v)) for s, v in ckpt["val"]], None,
                   ckpt["best_step"], ckpt["best_val"], ckpt["best_seconds"], r["train_seconds"], start=ckpt["step"])


def train_loop(work: Workload, spec: StepSpec, steps: int, log_every: int, log: Callable[[str], None] = print,
               eval_every: int = 0, saves: Checkpoints | None = None, resume: dict[str, Any] | None = None) -> Trained:
    """Train to `steps` steps from the initial weights (or from the checkpoint `resume`), a log line every
    `log_every`; with `eval_every`, the val loss on the fixed val set every `eval_every` steps and after the last,
    keeping the weights at the best one; with `saves`, a checkpoint every saves.every steps and after the last. The
    clock is stopped while it evaluates and saves."""
    tps = spec.tokens_per_step
    val_x, val_y = work.val_set(spec.seq_len) if eval_every else (None, None)
    with matmul_precision(spec):
        step, stream = work.step(spec), work.stream(spec)
        out = Trained({}, []) if resume is None else continued(resume, step, stream)
        pending: list[torch.Tensor] = []  # this stretch's losses on the device, read at a save or the end
        devicemem.sync(work.device)
        t0, last = time.perf_counter(), out.start
        for i in range(out.start, steps):
            pending.append(step(*next(stream)))
            done = i + 1
            evaluate = bool(eval_every) and (done % eval_every == 0 or done == steps)
            if done % log_every == 0 or done == steps or evaluate:
                loss = float(pending[-1])  # waits for the device: only at a log line
                seconds = time.perf_counter() - t0
                out.train_seconds += seconds
                n = done - last
                note = " (includes compiling)" if spec.compile and last == out.start else ""
                val = ""
                if evaluate and val_x is not None and val_y is not None:  # after the clock stopped: not training time
                    v = float(step.evaluate(val_x, val_y, work.cfg.batch_size))
                    out.val.append((done, v))
                    val = f", val {v:.3f}"
                    if out.best_val is None or v < out.best_val:
                        out.best_val, out.best_step, out.best_seconds = v, done, out.train_seconds
                        out.best_state = step.reference_state()
                    devicemem.return_host_memory()  # the clock is stopped: freed memory goes back (devicemem.py)
                log(f"step {done}, loss {loss:.3f}{val}, time {1e3 * seconds / n:.1f}ms, "
                    f"tokens/s {n * tps / seconds:,.0f}{note}")
                devicemem.sync(work.device)
                t0, last = time.perf_counter(), done
            if saves is not None and (saves.due(done) or done == steps):
                devicemem.sync(work.device)  # the steps queued so far are training time; the save is not
                paused = time.perf_counter()
                out.losses += torch.stack(pending).float().cpu().tolist()
                pending, out.state = [], step.reference_state()
                saves.save(out, step, stream, done)
                t0 += time.perf_counter() - paused
        if saves is None:  # nothing saved on the way: read at the end
            out.losses += torch.stack(pending).float().cpu().tolist()
            out.state = step.reference_state()
    return out


def checkpoint_to_resume(folder: str) -> tuple[Path, dict[str, Any]]:
    """A run folder and the checkpoint it continues from, refused (one line) when there is none, it cannot be read,
    its run has finished, or it lacks what continuing needs."""
    run_dir = Path(folder)
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise UsageError(f"no {CHECKPOINT} in {run_dir}: nothing to resume")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise UsageError(f"{path} cannot be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    done, steps = ckpt.get("step", len(ckpt.get("losses", ()))), ckpt.get("steps")
    if steps is not None and done >= steps:
        raise UsageError(f"{run_dir} has finished: its checkpoint is at step {done} of {steps}")
    if "resume" not in ckpt:
        raise UsageError(f"{path} holds no optimizer state or batch position to continue from")
    if ckpt["resume"]["optimizer"] is None:
        raise UsageError(f"{path} holds no optimizer state: its optimizer ({ckpt['spec']['optimizer']}) has no "
                         "state_dict")
    return run_dir, ckpt


def _flat(data: Any, prefix: str) -> dict[str, Any]:
    """Nested tables as {dotted path: value}."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}.{key}").items()}


def same_configuration(ckpt: dict[str, Any], now: dict[str, Any], run_dir: Path) -> None:
    """A usage error naming the first setting (or field of the spec) that differs between the run a checkpoint
    saved and what is asked now, FREE_ON_RESUME aside."""
    then = {**_flat(ckpt["settings"], "settings"), **_flat(ckpt["spec"], "spec")}
    asked = {**_flat(now["settings"], "settings"), **_flat(now["spec"], "spec")}
    free = {f"settings.{k}" for k in FREE_ON_RESUME}
    for key in [*then, *(k for k in asked if k not in then)]:
        if key not in free and then.get(key) != asked.get(key):
            name = key.removeprefix("settings.")
            raise UsageError(f"{run_dir} was trained with {name} = {_shown(then.get(key))}, not "
                             f"{_shown(asked.get(key))}: a run resumes with the configuration it was trained with")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def main(s: Settings) -> int:
    resume = checkpoint_to_resume(s.train.resume) if s.train.resume else None
    work, spec, source = plan(s)
    cfg, args = work.cfg, s.train
    log = (lambda line: None) if s.quiet else (lambda line: print(line, flush=True))
    if not args.run and args.rungs is None and resume is None:
        log(NO_CONFIGURATION)
    log(f"training {work.model.name if cfg.model is None else cfg.run.preset} ({work.params:,} parameters; "
          f"{work.model.convention_line}) on {work.corpus.source} with {source}: "
          f"B={spec.batch_size} T={spec.seq_len}, {spec.precision}, "
          f"{'compiled' + (f' ({spec.compile_mode})' if spec.compile_mode else '') if spec.compile else 'eager'}, "
          f"{spec.optimizer}" + (f", {', '.join(spec.transforms)}" if spec.transforms else "")
          + f", on {work.device}")
    if not cfg.run.recipe.is_default:
        log(f"recipe: {cfg.run.recipe.describe()}; schedule: {work.schedule.describe()}")
    if args.eval_every:
        log(f"validation every {args.eval_every} steps on {work.split.val_from} ({work.val.n_tokens:,} tokens, "
            f"{cfg.run.val_sequences} sequences), the clock stopped meanwhile")
    saved = {"config": dataclasses.asdict(cfg.model) if cfg.model else None,
             "model_def": {**codec.to_data(work.model.record()), "seq_len": cfg.seq_len},
             "spec": codec.to_data(spec), "tokenizer": work.corpus.tokenizer, "corpus": work.corpus.source,
             "steps": args.steps, "settings": {"train": codec.to_data(args), "run": codec.to_data(cfg.run)}}
    ckpt = None
    if resume is None:  # a new run folder, its configuration written before the first step
        run_dir = storage.new_run_dir(cfg.run.out)
        settings.write(run_dir / settings.CONFIG_FILE, dataclasses.replace(s, run=cfg.run),
                       f"speedladder train: the configuration of {run_dir}", ("run", "train", "quiet"))
    else:
        run_dir, ckpt = resume
        same_configuration(ckpt, saved, run_dir)
        log(f"resuming {run_dir} at step {ckpt['step']} of {args.steps}, from its checkpoint of {ckpt['created']}")
    trained = train_loop(work, spec, args.steps, args.log_every, log, args.eval_every,
                         Checkpoints(run_dir, args.save_every, saved), ckpt)
    values = trained.losses
    tail = values[-max(1, len(values) // 10):]
    print(f"loss {values[0]:.3f} -> {sum(tail) / len(tail):.3f} (mean of the last {len(tail)} steps)")
    if trained.best_step is not None:
        print(f"best val loss {trained.best_val:.3f} at step {trained.best_step}, after {trained.best_seconds:.2f} s "
              f"of training (of {trained.train_seconds:.2f} s; evaluation excluded"
              + ("; the first steps include compiling" if spec.compile else "") + f"): {run_dir / BEST}")
    if args.sample_tokens:
        print(sample(trained.state, work, args))
    print(f"checkpoint: {run_dir / CHECKPOINT}")
    return 0


def sample(state: dict[str, torch.Tensor], work: Workload, t: TrainConfig) -> str:
    """Text generated by the trained weights in the plain model, after the corpus's first tokens."""
    new_tokens = t.sample_tokens
    model = work.model.build(work.device)
    model.load_state_dict(state)
    model.eval()
    prompt = work.corpus.head(min(t.prompt_tokens, work.cfg.seq_len))[None].to(work.device)  # (1, P)
    gen = torch.Generator(device=work.device).manual_seed(work.cfg.run.seed)
    out = build.generate(work.model, model, prompt, new_tokens, t.temperature, t.top_k, work.cfg.seq_len, gen)
    if out is None:
        return "no sample: the model's forward returns a loss only, no logits to sample from"
    ids = out[0].tolist()
    tok = get_tokenizer(work.corpus.tokenizer)
    head, tail = tok.decode(ids[: prompt.shape[1]]), tok.decode(ids[prompt.shape[1]:])
    return (f"sample ({new_tokens} tokens after the corpus's first {prompt.shape[1]}, temperature {t.temperature}, "
            f"top-k {t.top_k}):\n[{head}]{tail}")
