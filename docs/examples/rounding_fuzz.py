"""A control rung that changes nothing but rounding: every module's output, every gradient it passes back and every
parameter's gradient times (1 + u), u uniform within FUZZ_SCALE x the unit roundoff of the tensor's format, drawn
afresh on each call from a table seeded with FUZZ_SEED. It computes the same function as the rung below it, so
every gate must pass it, at every seed, on your model too (docs/measurement.md, rule 12)."""

import os

import speedladder

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))  # times the unit roundoff: 2^-24 in fp32, 2^-8 in bf16
SEED = int(os.environ.get("FUZZ_SEED", "0"))

speedladder.rung.define("fuzz", "a control that only re-rounds: the gates must pass it at every seed",
                        kind="speed", model=speedladder.rounding_fuzz(scale=SCALE, seed=SEED))
