"""The checks a rung must pass: which apply (`gates`), the step against eager fp32 (`correctness`), probes at
probe weights (`probes`), the fp64 truth (`truth`), the kinks a rounding can flip (`kinks`, `flips`), lower
precision emulated in fp32 (`emulate`) and a failed gate's explanation (`bisect`)."""
