"""fp8 training of a model's block Linears through torchao's float8, on the Linears torchao's own filter says pay.

torchao swaps an nn.Linear for its Float8Linear: each matmul's operands cast to float8 with a scale each, the
product on fp8 tensor cores. Two of its recipes are rungs here (docs/usage.md):

- rowwise (the fp8 rung): a scale per row, e4m3 throughout, scales rounded down to powers of two. A token's scale
  is its own, so the step stays causal.
- tensorwise (fp8-tensorwise): one scale per tensor, e5m2 for the gradients. Its amax runs over every token of
  the batch, future ones included: past logits re-round when future tokens change, which the causality probe
  flags (tests/test_gates.py).

Both need torch.compile, which fuses each operand's amax, scale and cast into the kernels around the matmul
(torchao's float8 README, torchtitan's float8 docs); eager, each is a kernel of its own. And a Linear that is too
small does not pay back its casts: torchao's filter for each recipe (`_auto_filter_for_recipe`, exported by
torchao.float8 and unchanged from 0.12.0 to 0.18.0) keeps only the Linears its H100 benchmarks found faster. The
rungs convert the block Linears that filter keeps, and, from the model's shapes, are skipped before anything is
built where it keeps none.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from speedladder.errors import RungError
from speedladder.models.capability import Capability
from speedladder.models.gpt import Block, GPTConfig

FLOAT8_RECIPE = "rowwise"  # the fp8 rung's recipe (Float8LinearConfig.from_recipe_name)
# torchao's filter per recipe in words, N x K the weight's shape (N outputs, K inputs), both divisible by 16 too:
# torchao/float8/float8_linear_utils.py, _auto_filter_for_rowwise and _auto_filter_for_tensorwise (0.12.0 to
# 0.18.0). The words are for the reasons; the decision is torchao's own function (worth).
FILTER_RULES = {
    "rowwise": "N > 2048 and K > 1024, and not both N <= 4096 and K <= 2048",
    "tensorwise": "N > 1024 or K > 4096",
}


def worth(module: nn.Module, name: str, recipe: str) -> bool:
    """Whether torchao's own filter for the recipe converts this module (a Linear large enough to pay)."""
    from torchao.float8 import _auto_filter_for_recipe  # an optional extra, checked by the rung's requirement

    return bool(_auto_filter_for_recipe(recipe, filter_fqns=[])(module, name))


def float8_eligible(module: nn.Module, name: str, prefix: str, recipe: str = FLOAT8_RECIPE) -> bool:
    """A Linear an fp8 rung converts: under the blocks' prefix, both dimensions divisible by 16 (fp8 matmuls'
    constraint), and kept by torchao's filter for the recipe. The head stays in bf16: the softmax over the
    vocabulary is sensitive."""
    return (isinstance(module, nn.Linear) and name.startswith(prefix)
            and module.in_features % 16 == 0 and module.out_features % 16 == 0 and worth(module, name, recipe))


def float8_matmul_params(model: nn.Module, prefix: str = "blocks.", recipe: str = FLOAT8_RECIPE) -> int:
    """The weights in the matmuls an fp8 rung runs in fp8: 6 x this is their training FLOPs per token, the fp8
    share of the step that the rung's MFU peak is blended by (measure/peakflops.blended_peak)."""
    return sum(m.in_features * m.out_features for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and float8_eligible(m, name, prefix, recipe))


def none_qualify(recipe: str, linears: list[tuple[str, nn.Linear]]) -> str | None:
    """Why no Linear of these is converted under the recipe, each shape named (N x K); None when one is."""
    if any(float8_eligible(m, name, "", recipe) for name, m in linears):
        return None
    shapes = ", ".join(dict.fromkeys(f"{name} {m.out_features}x{m.in_features}" for name, m in linears))
    return (f"no block Linear qualifies for torchao's {recipe} filter (N x K, kept where {FILTER_RULES[recipe]}): "
            f"{shapes or 'no Linear in the blocks'}")


def block_linears(cfg: GPTConfig) -> list[tuple[str, nn.Linear]]:
    """One block's Linears at these shapes, by their names in the block, built on the meta device (no memory)."""
    with torch.device("meta"):
        block = Block(cfg)
    return [(name, m) for name, m in block.named_modules() if isinstance(m, nn.Linear)]


def fits(recipe: str) -> Callable[[GPTConfig], str | None]:
    """An fp8 rung's shape requirement: why torchao's filter keeps none of the blocks' Linears, or None. Read from
    the model's shapes before anything is built; without torchao it says nothing (the package check does)."""
    def check(cfg: GPTConfig) -> str | None:
        if importlib.util.find_spec("torchao") is None:
            return None
        return none_qualify(recipe, block_linears(cfg))
    check.__name__ = f"torchao's {recipe} filter"  # what results.json records of the requirement
    return check


def float8_linears(model: nn.Module, prefix: str = "blocks.", recipe: str = FLOAT8_RECIPE,
                   emulate: bool = False) -> nn.Module:
    """torchao's float8 training for the block Linears (under `prefix`) its filter keeps; the head stays in bf16.

    A model whose shapes were not known before it was built (a user's, most Hugging Face ones) reaches here with
    none kept: a RungError names the shapes. `emulate`: the same casts with the matmuls done in high precision
    (torchao's emulation), which runs on a CPU: what the tests use.
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def keep(m: nn.Module, name: str) -> bool:
        return float8_eligible(m, name, prefix, recipe)

    if not any(keep(m, name) for name, m in model.named_modules()):
        linears = [(name.removeprefix(prefix).partition(".")[2] or name, m) for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and name.startswith(prefix)]
        raise RungError(none_qualify(recipe, linears) or f"no block Linear qualifies for torchao's {recipe} filter")
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    return convert_to_float8_training(model, config=config, module_filter_fn=keep)


def float8_transforms(prefix: str) -> dict[Capability, Callable[[nn.Module], nn.Module]]:
    """Each fp8 rung's model transform for blocks under `prefix`, by the capability it provides: what a model
    family whose blocks are found elsewhere than our GPT's offers (models/hf.py, models/user.py)."""
    return {cap: functools.partial(float8_linears, prefix=prefix, recipe=recipe)
            for cap in Capability if (recipe := cap.float8_recipe) is not None}
