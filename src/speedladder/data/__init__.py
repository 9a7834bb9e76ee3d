"""The data: tokenizers (tokenizers.py), a corpus and its checks (corpus.py), the batch stream (batches.py).

Nothing on a default path touches the network: the corpora and the GPT-2 ranks ship inside the package (assets/),
and tiktoken is built from the local ranks.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def asset(name: str = "") -> Path:
    """A file shipped in speedladder/assets (an embedded corpus, GPT-2's BPE ranks), or the folder itself."""
    return Path(str(resources.files("speedladder").joinpath("assets").joinpath(name)))
