"""`speedladder train`: train one configuration, log like the source text, sample text, save a checkpoint.

The configuration is a tuned or measured winner (`--run RUN_DIR`, or
`--config winner.toml`), the spec that `--rungs` compose to, or by default the
top of the full ladder on this machine: every full-ladder rung whose
requirement is met here, composed in order (not measured; a measured winner
needs `--run` or tune's winner.toml).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from speedladder import measure, models, results, settings
from speedladder.config import FULL_LADDER
from speedladder.data import get_tokenizer
from speedladder.errors import UsageError
from speedladder.gpt import GPT, GPTConfig
from speedladder.rungs import RUNGS, Env, StepSpec, compose
from speedladder.settings import Settings, TrainConfig
from speedladder.step import matmul_precision
from speedladder.workload import Workload, prepare

CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"  # the weights at the lowest val loss


def default_rungs(env: Env) -> tuple[str, ...]:
    """The full ladder's rungs that can run on this machine, in order."""
    return tuple(n for n in FULL_LADDER if RUNGS[n].requires.unmet(env) is None)


def plan(s: Settings) -> tuple[Workload, StepSpec, str]:
    """The workload and the spec to train, and a phrase saying where the spec came from: the winner of --run
    (whose saved workload the command line has put under the flags), --rungs, or the top of the full ladder."""
    t = s.train
    if t.run:
        won = results.load(t.run).winner()
        if won is None:
            raise UsageError(f"{t.run} names no configuration that passed every gate")
        name, names = won
        source = f"{name} from {t.run}"
    else:  # given rungs (an empty list: eager alone, a winner that was eager)
        names = tuple(n for n in t.rungs or () if n != "eager")
        source = "--rungs " + ",".join(t.rungs or ("eager",))
    work = _checked(prepare(dataclasses.replace(s.run, rungs=("eager", *names), ladder=None, beside=())), t)
    if not t.run and t.rungs is None:
        names = default_rungs(work.env)
        source = "the top of the full ladder here (" + ",".join(names) + ")"
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
    model = GPT(GPTConfig(**ckpt["config"])) if ckpt.get("config") else models.rebuild(ckpt["model_def"])
    model.load_state_dict(ckpt["model"])
    return model, ckpt


@dataclass
class Trained:
    """What a training run leaves: the final weights, every loss, and the val curve with its best point."""

    state: dict[str, torch.Tensor]  # the final weights, under the reference names and shapes
    losses: list[float]
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, val loss) at every evaluation
    best_state: dict[str, torch.Tensor] | None = None  # the weights at the lowest val loss
    best_step: int | None = None
    best_val: float | None = None
    best_seconds: float | None = None  # the training clock there: steps only, evaluations excluded
    train_seconds: float = 0.0


def train_loop(work: Workload, spec: StepSpec, steps: int, log_every: int, log: Callable[[str], None] = print,
               eval_every: int = 0) -> Trained:
    """Train `steps` steps from the initial weights, a log line every `log_every`; with `eval_every`, the val loss
    on the fixed val set every `eval_every` steps and after the last (the clock stopped meanwhile), keeping the
    weights at the best one."""
    losses: list[torch.Tensor] = []
    tps = spec.tokens_per_step
    val_x, val_y = work.val_set(spec.seq_len) if eval_every else (None, None)
    out = Trained({}, [])
    with matmul_precision(spec):
        step, stream = work.step(spec), work.stream(spec)
        measure.sync(work.device)
        t0, last = time.perf_counter(), 0
        for i in range(steps):
            losses.append(step(*next(stream)))
            done = i + 1
            evaluate = bool(eval_every) and (done % eval_every == 0 or done == steps)
            if done % log_every == 0 or done == steps or evaluate:
                loss = float(losses[-1])  # waits for the device: only at a log line
                seconds = time.perf_counter() - t0
                out.train_seconds += seconds
                n = done - last
                note = " (includes compiling)" if spec.compile and last == 0 else ""
                val = ""
                if evaluate:  # after the clock stopped: evaluation is not training time
                    v = float(step.evaluate(val_x, val_y, work.cfg.batch_size))  # type: ignore[arg-type]
                    out.val.append((done, v))
                    val = f", val {v:.3f}"
                    if out.best_val is None or v < out.best_val:
                        out.best_val, out.best_step, out.best_seconds = v, done, out.train_seconds
                        out.best_state = step.reference_state()
                    measure.return_host_memory()  # the clock is stopped: freed memory goes back (measure.py)
                log(f"step {done}, loss {loss:.3f}{val}, time {1e3 * seconds / n:.1f}ms, "
                    f"tokens/s {n * tps / seconds:,.0f}{note}")
                measure.sync(work.device)
                t0, last = time.perf_counter(), done
        out.state = step.reference_state()
    out.losses = torch.stack(losses).float().cpu().tolist()
    return out


def main(s: Settings) -> int:
    work, spec, source = plan(s)
    cfg, args = work.cfg, s.train
    log = (lambda line: None) if s.quiet else (lambda line: print(line, flush=True))
    log(f"training {work.model.name if cfg.model is None else cfg.run.preset} ({work.params:,} parameters; "
          f"{work.model.convention_line}) on {work.corpus.source} with {source}: "
          f"B={spec.batch_size} T={spec.seq_len}, {spec.precision}, "
          f"{'compiled' + (f' ({spec.compile_mode})' if spec.compile_mode else '') if spec.compile else 'eager'}, "
          f"{spec.optimizer}" + (f", {', '.join(spec.transforms)}" if spec.transforms else "")
          + f", on {work.device}")
    if args.eval_every:
        log(f"validation every {args.eval_every} steps on {work.split.val_from} ({work.val.n_tokens:,} tokens, "
            f"{cfg.run.val_sequences} sequences), the clock stopped meanwhile")
    trained = train_loop(work, spec, args.steps, args.log_every, log, eval_every=args.eval_every)
    values = trained.losses
    tail = values[-max(1, len(values) // 10):]
    print(f"loss {values[0]:.3f} -> {sum(tail) / len(tail):.3f} (mean of the last {len(tail)} steps)")
    run_dir = results.new_run_dir(args.out)
    saved = {"config": dataclasses.asdict(cfg.model) if cfg.model else None,
             "model_def": {**work.model.record(), "seq_len": cfg.seq_len},
             "spec": {**spec.to_dict(), "transforms": list(spec.transforms)},
             "tokenizer": work.corpus.tokenizer, "corpus": work.corpus.source, "steps": args.steps,
             "losses": values, "val": trained.val, "created": results.now()}
    path = run_dir / CHECKPOINT
    torch.save({"model": trained.state, **saved}, path)
    if trained.best_state is not None:
        torch.save({"model": trained.best_state, **saved, "best_step": trained.best_step,
                    "best_val": trained.best_val, "best_seconds": trained.best_seconds}, run_dir / BEST)
        print(f"best val loss {trained.best_val:.3f} at step {trained.best_step}, after {trained.best_seconds:.2f} s "
              f"of training (of {trained.train_seconds:.2f} s; evaluation excluded"
              + ("; the first steps include compiling" if spec.compile else "") + f"): {run_dir / BEST}")
    settings.write(run_dir / settings.CONFIG_FILE, dataclasses.replace(s, run=cfg.run),
                   f"speedladder train: the configuration of {run_dir}", ("run", "train", "quiet"))
    if args.sample_tokens:
        print(sample(trained.state, work, args))
    print(f"checkpoint: {path}")
    return 0


def sample(state: dict[str, torch.Tensor], work: Workload, t: TrainConfig) -> str:
    """Text generated by the trained weights in the plain model, after the corpus's first tokens."""
    new_tokens = t.sample_tokens
    model = work.model.build(work.device)
    model.load_state_dict(state)
    model.eval()
    prompt = work.corpus.head(min(t.prompt_tokens, work.cfg.seq_len))[None].to(work.device)  # (1, P)
    gen = torch.Generator(device=work.device).manual_seed(work.cfg.run.seed)
    out = models.generate(work.model, model, prompt, new_tokens, t.temperature, t.top_k, work.cfg.seq_len, gen)
    if out is None:
        return "no sample: the model's forward returns a loss only, no logits to sample from"
    ids = out[0].tolist()
    tok = get_tokenizer(work.corpus.tokenizer)
    head, tail = tok.decode(ids[: prompt.shape[1]]), tok.decode(ids[prompt.shape[1]:])
    return (f"sample ({new_tokens} tokens after the corpus's first {prompt.shape[1]}, temperature {t.temperature}, "
            f"top-k {t.top_k}):\n[{head}]{tail}")
