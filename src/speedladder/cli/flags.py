"""The flags the commands share, each default read from the config dataclasses, and their mapping onto a RunConfig."""

from __future__ import annotations

import argparse

from speedladder.config import (
    LADDERS,
    PRESETS,
    SOURCE_LADDER,
    GateConfig,
    ProfileConfig,
    RunConfig,
    TimingConfig,
    default,
)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


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
    p.add_argument("--batch-multiplier", type=int, metavar="K",
                   help="the batch rung multiplies the batch by K. Default: the preset's")


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the run folder goes, and whether progress is shown: shared by the commands that write one."""
    p.add_argument("--out", default=default(RunConfig, "out"), metavar="DIR",
                   help="parent folder of the run folder DIR/<timestamp>/. Default: %(default)s")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-steps", type=int, default=default(ProfileConfig, "steps"), metavar="N",
                   help="steps profiled, each synchronized at its end. Default: %(default)s")


def run_config(args: argparse.Namespace) -> RunConfig:
    """The flags as a RunConfig; a flag a command does not have keeps the dataclass default."""
    gates = GateConfig()
    return RunConfig(
        preset=args.preset, data=args.data, tokenizer=args.tokenizer, model_source=args.model, hf=args.hf,
        hf_set=tuple(args.hf_set or ()), vocab_size=args.vocab_size, batch_size=args.batch_size,
        seq_len=args.seq_len, batch_multiplier=args.batch_multiplier, ladder=getattr(args, "ladder", "source"),
        rungs=getattr(args, "rungs", None), device=args.device,
        lr=args.lr, seed=args.seed, out=args.out, peak_tflops=getattr(args, "peak_tflops", None),
        timing=TimingConfig(steps=args.steps, windows=args.windows, warmup=args.warmup,
                            max_warmup=args.max_warmup),
        gates=GateConfig(loss_steps=getattr(args, "loss_steps", gates.loss_steps),
                         loss_band=getattr(args, "loss_band", gates.loss_band),
                         learns_steps=getattr(args, "learns_steps", gates.learns_steps),
                         learns_min_drop=getattr(args, "learns_min_drop", gates.learns_min_drop),
                         target_steps=getattr(args, "target_steps", gates.target_steps)),
        profile=ProfileConfig(enabled=not getattr(args, "no_profile", False),
                              steps=getattr(args, "profile_steps", default(ProfileConfig, "steps"))),
    )


