"""The techniques: every rung, built-in or a user's, declared through one API (api.py) into one registry, RUNGS.

builtin.py declares the source text's rungs and the ladder beyond; speedrun.py the speedrun's model records;
load.py brings a user's rung files (--rung-file). Importing this package declares the built-in ones.
"""

from speedladder.rungs import builtin, speedrun  # noqa: F401 -- declaring them registers them
from speedladder.rungs.api import (
    ADAMW_VARIANTS,
    BUILT_IN,
    CHANGES_FUNCTION,
    KINDS,
    MODEL_TRANSFORMS,
    NEW_PARAMS,
    OPTIMIZERS,
    RUNGS,
    TRANSFORM_KINDS,
    Env,
    Requirement,
    Rung,
    RungError,
    StepSpec,
    compose,
    env_for,
    kind_of,
    lr_factor,
    rung,
    unregister,
)
from speedladder.rungs.builtin import (
    FLOAT8_RECIPE,
    VOCAB_MULTIPLE,
    Checkpointed,
    PaddedHead,
    SDPAttention,
    checkpoint_blocks,
    float8_eligible,
    float8_linears,
    float8_matmul_params,
    pad_vocab,
    padded_vocab,
    use_sdpa,
)
from speedladder.rungs.capability import Capability
from speedladder.rungs.fuzz import UNIT_ROUNDOFF, rounding_fuzz

__all__ = [
    "ADAMW_VARIANTS",
    "BUILT_IN",
    "CHANGES_FUNCTION",
    "FLOAT8_RECIPE",
    "KINDS",
    "MODEL_TRANSFORMS",
    "NEW_PARAMS",
    "OPTIMIZERS",
    "RUNGS",
    "TRANSFORM_KINDS",
    "UNIT_ROUNDOFF",
    "VOCAB_MULTIPLE",
    "Capability",
    "Checkpointed",
    "Env",
    "PaddedHead",
    "Requirement",
    "Rung",
    "RungError",
    "SDPAttention",
    "StepSpec",
    "checkpoint_blocks",
    "compose",
    "env_for",
    "float8_eligible",
    "float8_linears",
    "float8_matmul_params",
    "kind_of",
    "lr_factor",
    "pad_vocab",
    "padded_vocab",
    "rounding_fuzz",
    "rung",
    "unregister",
    "use_sdpa",
]
