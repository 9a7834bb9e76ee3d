"""A real win on the tiny preset: three times AdamW's learning rate, measured 1.5x sooner to the target on the
development CPU (docs/judge.md)."""

import speedladder

speedladder.rung.define("lr-3x", "three times the learning rate: the tiny model trains too slowly at 1e-3",
                        kind="optimizer", spec={"lr_scale": 3.0})
