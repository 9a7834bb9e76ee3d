"""Data parallelism: the cost model (`costmodel`), the torchrun job (`launch`), one rank (`rank`) and its record
(`section`)."""
