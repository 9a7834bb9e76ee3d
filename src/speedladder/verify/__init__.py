"""The checks a rung must pass: which apply (`gates`), the step against eager fp32 (`correctness`), probes at
probe weights (`probes`) and the fp64 truth (`truth`).

`speedladder.verify.equivalence` and the rest still work, for one release: the package hands on `correctness`'s
names (and a patch of one reaches `correctness`).
"""

from speedladder.meta import hand_on

hand_on(__name__, "correctness")
