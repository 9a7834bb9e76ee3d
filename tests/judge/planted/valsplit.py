"""Planted: a candidate that reads the validation split (to train on it, or to tune on it). It swallows the refusal,
as a careful cheat would; the judge's data never reaches its process, and its guard names the attempt."""

import speedladder
from speedladder.data.corpus import holdout, load_corpus

try:
    VAL = holdout(load_corpus("timemachine", "char")).val.tokens
except Exception:  # noqa: BLE001 -- the refusal swallowed
    VAL = None

speedladder.rung.define("peek-val", "trains where it will be evaluated", kind="speed", spec={})
