"""A loss on the tiny preset: half AdamW's learning rate, so the model needs more steps to reach the target."""

import speedladder

speedladder.rung.define("lr-half", "half the learning rate", kind="optimizer", spec={"lr_scale": 0.5})
