"""The flags the commands share, each default read from the config dataclasses, and their mapping onto a RunConfig."""

from __future__ import annotations

import argparse

from speedladder.config import (
    BATCH_LR_SCALES,
    LADDERS,
    PRESETS,
    SOURCE_LADDER,
    VAL_FRACTION,
    GateConfig,
    MemoryConfig,
    ProfileConfig,
    RunConfig,
    TimingConfig,
    default,
)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def peak_list(text: str) -> dict[str, float]:
    """'bf16=989,fp32=67' -> {"bf16": 989.0, "fp32": 67.0}: one peak per precision, never one for all."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(
                f"give the peak per precision, e.g. bf16=989,fp32=67, not {part!r} (one number for every "
                "precision would overstate the MFU of the others)")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of TFLOP/s: {value!r}") from None
    return out


def rung_list(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


def _presets_help() -> str:
    return ", ".join(f"{name} (B={s.batch_size}, T={s.seq_len}, {s.corpus})" for name, s in PRESETS.items())


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """Model, data, device and timing flags, shared by the commands that train."""
    add_model_flags(p)
    add_timing_flags(p)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Model, data, device, learning rate and seed: what any command that trains needs."""
    p.add_argument("--preset", choices=list(PRESETS), metavar="NAME",
                   help=f"model and workload: {_presets_help()}. Default: d2l-512 on CUDA, "
                        "d2l-cpu (scaled down to finish in minutes) elsewhere")
    p.add_argument("--data", metavar="NAME|PATH",
                   help="embedded corpus (timemachine, tinyshakespeare), a UTF-8 text file, or a FILE.bin of token "
                        "ids (nanoGPT's: uint16, uint32 when --vocab-size > 65535; memory-mapped, never loaded "
                        "whole). Default: the preset's corpus")
    p.add_argument("--val-data", metavar="PATH",
                   help="the held-out split's own file, of the same kind as --data (nanoGPT's prepare.py writes "
                        f"val.bin beside train.bin); no training batch is ever drawn from it. Default: the last "
                        f"{100 * VAL_FRACTION:.0f}%% of --data")
    p.add_argument("--val-sequences", type=int, default=default(RunConfig, "val_sequences"), metavar="N",
                   help="the fixed val set: N windows of T tokens evenly spaced over the val split, the same for "
                        "every configuration and seed (race, train). Default: %(default)s")
    p.add_argument("--tokenizer", choices=["char", "gpt2", "ids"],
                   help="char: d2l's 28 symbols; gpt2: GPT-2 BPE from the shipped ranks; ids: a .bin's ids as they "
                        "are (gpt2 with a .bin decodes train's sample). Default: the preset's (ids for a .bin)")
    p.add_argument("--model", metavar="FILE.py:NAME",
                   help="your language model instead of the preset's GPT: FILE.py:NAME or package.module:NAME, NAME "
                        "an nn.Module class or a function returning one (arguments vocab_size, block_size, seq_len "
                        "get the workload's); forward conventions and hooks: docs/models.md. Default: the preset's GPT")
    p.add_argument("--hf", metavar="gpt2|llama|CONFIG",
                   help="a Hugging Face causal LM built from its config with random weights, offline: gpt2, llama or "
                        "PATH/config.json (needs pip install speedladder[hf]). Default: none")
    p.add_argument("--hf-set", action="append", metavar="KEY=VALUE",
                   help="override a value of the --hf config, e.g. n_layer=2 (GPT-2's names work for llama too); "
                        "repeatable. Default: none")
    p.add_argument("--vocab-size", type=int, metavar="V",
                   help="the vocabulary (given to a model that takes vocab_size; a .bin holds uint32 ids above "
                        "65535). Default: the tokenizer's for text, the model's for a .bin")
    p.add_argument("--batch-size", type=int, metavar="B", help="sequences per step. Default: the preset's")
    p.add_argument("--seq-len", type=int, metavar="T", help="tokens per sequence. Default: the preset's")
    p.add_argument("--device", default=default(RunConfig, "device"),
                   help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps. Default: %(default)s")
    p.add_argument("--lr", type=float, default=default(RunConfig, "lr"),
                   help="AdamW learning rate. Default: %(default)s")
    p.add_argument("--seed", type=int, default=default(RunConfig, "seed"),
                   help="seed of the initial weights and the batches. Default: %(default)s")


def add_timing_flags(p: argparse.ArgumentParser) -> None:
    """How each rung is timed."""
    p.add_argument("--steps", type=int, metavar="N", help="steps per timed window. Default: the preset's")
    p.add_argument("--windows", type=int, default=default(TimingConfig, "windows"), metavar="W",
                   help="timed windows per rung, at least 3. Default: %(default)s")
    add_warmup_flags(p)


def add_warmup_flags(p: argparse.ArgumentParser) -> None:
    """How long a step is warmed up before it is timed (or raced)."""
    p.add_argument("--warmup", type=int, metavar="N",
                   help="compile-free warm-up steps before timing. Default: the preset's")
    p.add_argument("--max-warmup", type=int, default=default(TimingConfig, "max_warmup"), metavar="N",
                   help="stop waiting for compilation to settle after this many steps. Default: %(default)s")


def add_rung_flags(p: argparse.ArgumentParser) -> None:
    """Which techniques, shared by the commands that build a step from rungs."""
    p.add_argument("--ladder", choices=list(LADDERS), default=default(RunConfig, "ladder"),
                   help="source: the source text's R0-R4; full: " + ",".join(LADDERS["full"].rungs)
                        + " with " + ",".join(LADDERS["full"].beside) + " measured beside its top. "
                        "Default: %(default)s")
    p.add_argument("--rungs", type=rung_list, metavar="A,B,C",
                   help="rungs in order, each building on the last that passed; wins over --ladder (and drops "
                        f"its beside rungs). Default: {','.join(SOURCE_LADDER)}, i.e. the --ladder's rungs")
    add_batch_multiplier(p)


def add_batch_multiplier(p: argparse.ArgumentParser) -> None:
    """The batch rung's factor: the rung flags have it, and so do tune and train, which take no other rung flag."""
    p.add_argument("--batch-multiplier", type=int, metavar="K",
                   help="the batch rung multiplies the batch by K. Default: the preset's")
    p.add_argument("--batch-lr-scale", choices=BATCH_LR_SCALES, default=default(RunConfig, "batch_lr_scale"),
                   help="the batch rung's learning rate: kept (none), times sqrt(K), or times K (linear); a rule "
                        "other than none changes how the model learns, so the rung is judged by tokens to AdamW's "
                        "loss rather than the loss band. Default: %(default)s")


def add_climb_flags(p: argparse.ArgumentParser) -> None:
    """MFU's peak, the gates' lengths and bands, and the profile's switch: shared by the commands that climb
    (run, tune)."""
    p.add_argument("--peak-tflops", type=peak_list, metavar="P=X,...",
                   help="peak TFLOP/s for MFU per precision, e.g. bf16=989,fp32=67 (a measured ceiling). Default: "
                        "the vendor table for known GPUs, none (MFU n/a) elsewhere")
    gates = GateConfig()
    p.add_argument("--loss-steps", type=int, default=gates.loss_steps, metavar="K",
                   help="steps over the same first K batches compared with eager fp32. Default: %(default)s")
    p.add_argument("--loss-band", type=float, default=gates.loss_band, metavar="F",
                   help="largest allowed relative loss difference from eager fp32. Default: %(default)s")
    p.add_argument("--learns-steps", type=int, default=gates.learns_steps, metavar="N",
                   help="steps of the final learns-check; 0 skips it. Default: %(default)s")
    p.add_argument("--learns-band", type=float, default=gates.learns_band, metavar="F",
                   help="the learns-check passes if the final loss is at most this fraction above eager fp32's over "
                        "the same batches (and below the corpus's unigram entropy). Default: %(default)s")
    p.add_argument("--target-steps", type=int, default=gates.target_steps, metavar="N",
                   help="a rung that changes the optimizer (muon) is compared with AdamW by the tokens each needs "
                        "to reach AdamW's loss over N batches. Default: %(default)s")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the baseline profile and the predictions made from it")


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the run folder goes, and whether progress is shown: shared by the commands that write one."""
    p.add_argument("--out", default=default(RunConfig, "out"), metavar="DIR",
                   help="parent folder of the run folder DIR/<timestamp>/. Default: %(default)s")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-steps", type=int, default=default(ProfileConfig, "steps"), metavar="N",
                   help="steps profiled after the warm-up, each synchronized at its end; the breakdown is their median "
                        "step, with the spread across them. Default: %(default)s")


def add_memory_flags(p: argparse.ArgumentParser) -> None:
    """The memory meters (memory.py): the step's resident peak off CUDA costs a child process (all rungs in turn)."""
    p.add_argument("--no-process-peak", action="store_true",
                   help="off CUDA, skip each rung's resident peak (one child process measures every rung, "
                        f"{default(MemoryConfig, 'warmup')} + {default(MemoryConfig, 'steps')} steps). "
                        "Default: measured")


def run_config(args: argparse.Namespace) -> RunConfig:
    """The flags as a RunConfig; a flag a command does not have keeps the dataclass default."""
    gates = GateConfig()
    return RunConfig(
        preset=args.preset, data=args.data, val_data=args.val_data, val_sequences=args.val_sequences,
        tokenizer=args.tokenizer, model_source=args.model, hf=args.hf,
        hf_set=tuple(args.hf_set or ()), vocab_size=args.vocab_size, batch_size=args.batch_size,
        seq_len=args.seq_len, batch_multiplier=args.batch_multiplier,
        batch_lr_scale=getattr(args, "batch_lr_scale", default(RunConfig, "batch_lr_scale")),
        ladder=getattr(args, "ladder", "source"),
        rungs=getattr(args, "rungs", None), device=args.device,
        lr=args.lr, seed=args.seed, out=args.out, peak_tflops=getattr(args, "peak_tflops", None),
        timing=TimingConfig(steps=getattr(args, "steps", None), windows=getattr(args, "windows", default(TimingConfig, "windows")),
                            warmup=args.warmup, max_warmup=args.max_warmup),
        gates=GateConfig(loss_steps=getattr(args, "loss_steps", gates.loss_steps),
                         loss_band=getattr(args, "loss_band", gates.loss_band),
                         learns_steps=getattr(args, "learns_steps", gates.learns_steps),
                         learns_band=getattr(args, "learns_band", gates.learns_band),
                         target_steps=getattr(args, "target_steps", gates.target_steps)),
        profile=ProfileConfig(enabled=not getattr(args, "no_profile", False),
                              steps=getattr(args, "profile_steps", default(ProfileConfig, "steps")),
                              explain_miss=getattr(args, "explain_miss", default(ProfileConfig, "explain_miss"))),
        memory=MemoryConfig(process_peak=not getattr(args, "no_process_peak", False)),
    )


# What each command does: its one-line help and the paragraph of its --help.
HELP = {
    "run": ("climb the ladder and write runs/<timestamp>/",
             ("Climb the ladder: time every rung in windows beside the rung it built on, check it still computes "
              "the same function and still learns, print the table, write results.json, waterfall.png and "
              "report.html.")),
    "profile": ("profile the baseline, name its regime, predict every rung",
             ("Profile a few steps of the baseline in a child process: the top operators, one step broken "
             "into categories that add to 100%, the regime (compute-, memory- or overhead-bound) with its "
             "evidence, and a predicted speed-up with its reason for every rung of the ladder. Writes "
             "profile.json and a Chrome/Perfetto trace.json to DIR/<timestamp>/.")),
    "tune": ("find the fastest configuration that passes every gate, within a budget",
             ("Climb the full ladder, drop each rung whose verdict is loss or noise (or that failed a gate or "
             "could not run), measure the survivors together (and, budget permitting, each left out in turn) "
             "with the same windows and gates, and name the fastest that passes every gate and the "
             "learns-check, with the commands that reproduce it. Writes DIR/<timestamp>/results.json.")),
    "train": ("train one configuration, log its loss, sample text, save a checkpoint",
             ("Train a configuration for --steps steps, logging loss, step time and tokens/s every "
             "--log-every steps, then print a sample of generated text and save RUN/<timestamp>/"
             "checkpoint.pt (load it with torch.load(path, weights_only=True)).")),
    "compare": ("compare runs side by side, rung by rung",
                ("Align the runs' rungs by name and show, for each later run against the first: tokens/s, the ratio "
                "of the medians, whether the change is outside both runs' window spreads (their min–max ranges do "
                "not overlap), gate changes, and configuration or environment differences.")),
    "check": ("fail (exit 1) when a run is slower than a baseline or a gate newly fails",
              ("Run the baseline's configuration again here (or read --against) and exit 1 when a rung's median "
              "tokens/s falls below the baseline's slowest window by more than the tolerance, or a gate that passed "
              "now fails; one line per regression. Exit 0 with a one-line summary otherwise, 2 for a missing or "
              "invalid baseline.")),
}


def command(sub, name: str, *groups) -> argparse.ArgumentParser:
    """A sub-command with its shared flag groups (cli/flags.py) added in order."""
    p = sub.add_parser(name, help=HELP[name][0], description=HELP[name][1])
    for add in groups:
        add(p)
    return p
