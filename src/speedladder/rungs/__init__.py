"""The techniques: every rung, built-in or a user's, declared through one API (registry.py) into one registry, RUNGS.

builtin.py declares the source text's rungs and the ladder beyond (their model transforms are the models' own:
models/transforms.py, models/float8.py for the fp8 rungs' side of torchao); speedrun.py the speedrun's model
records; files.py brings a user's rung files (--rung-file). Importing this package declares the built-in ones.
"""

from speedladder.models.float8 import (
    FLOAT8_RECIPE,
    float8_eligible,
    float8_linears,
    float8_matmul_params,
    float8_transforms,
)
from speedladder.models.transforms import (
    VOCAB_MULTIPLE,
    Checkpointed,
    PaddedHead,
    SDPAttention,
    checkpoint_blocks,
    pad_vocab,
    padded_vocab,
    use_sdpa,
)
from speedladder.rungs import builtin, speedrun  # noqa: F401 -- declaring them registers them
from speedladder.rungs.fuzz import UNIT_ROUNDOFF, rounding_fuzz
from speedladder.rungs.registry import (
    BUILT_IN,
    CHANGES_FUNCTION,
    KINDS,
    MODEL_TRANSFORMS,
    NEW_PARAMS,
    OPTIMIZERS,
    RUNGS,
    TRANSFORM_KINDS,
    Env,
    ModelFacts,
    Requirement,
    Rung,
    RungDeclarer,
    RungError,
    architecture,
    compose,
    env_for,
    kind_of,
    lr_factor,
    rung,
    unregister,
)
from speedladder.spec import ADAMW_VARIANTS, Capability

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
    "ModelFacts",
    "PaddedHead",
    "Requirement",
    "Rung",
    "RungDeclarer",
    "RungError",
    "SDPAttention",
    "architecture",
    "checkpoint_blocks",
    "compose",
    "env_for",
    "float8_eligible",
    "float8_linears",
    "float8_matmul_params",
    "float8_transforms",
    "kind_of",
    "lr_factor",
    "pad_vocab",
    "padded_vocab",
    "rounding_fuzz",
    "rung",
    "unregister",
    "use_sdpa",
]
