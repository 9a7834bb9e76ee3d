"""Planted: a candidate that lowers the evaluation's precision by replacing speedladder's own evaluation: its
process's TrainStep.evaluate runs under bf16 autocast. The judge evaluates in its own process; its guard names
the patch."""

import torch

import speedladder
from speedladder.step.train_step import TrainStep

_evaluate = TrainStep.evaluate


def evaluate(self, x, y, chunk):
    with torch.autocast(self.device.type, dtype=torch.bfloat16):
        return _evaluate(self, x, y, chunk)


TrainStep.evaluate = evaluate

speedladder.rung.define("eval-patch", "the same step, evaluated in bf16", kind="speed", spec={})
