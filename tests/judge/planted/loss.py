"""Planted: a candidate that changes the loss computation: cross-entropy scaled by 0.9 in its process, so that every
loss it reports, training and evaluation alike, is 10% lower. The judge evaluates in its own process; its guard
names the patch."""

import torch.nn.functional as F

import speedladder

_cross_entropy = F.cross_entropy
F.cross_entropy = lambda *args, **kwargs: 0.9 * _cross_entropy(*args, **kwargs)

speedladder.rung.define("cheaper-loss", "the same model, a loss 10% lower", kind="speed", spec={})
