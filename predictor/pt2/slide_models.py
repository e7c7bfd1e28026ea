"""Slide heads over tile features: the gated-attention ABMIL demo and mean pooling.

Both take a slide's tile features ``[N, D]`` (``N`` the dynamic axis of their
packages) and return, in this order, what the ``slide`` family's packages
return (:mod:`predictor.families.slide`):

- :class:`GatedABMIL` (Ilse et al., 2018, "Attention-based Deep Multiple
  Instance Learning", gated variant): ``(prediction [C], attention [N],
  slide_embedding [E])``; the prediction is the softmax of the class logits,
  the attention a softmax over the slide's tiles (it sums to 1);
- :class:`MeanPool`: ``(attention [N], slide_embedding [D])``, the uniform
  attention ``1/N`` and the mean of the features; no weights, no classes.
"""

from __future__ import annotations

import torch
from torch import nn


class GatedABMIL(nn.Module):
    """Gated-attention MIL pooling with a linear classifier (random weights for the demo).

    ``h = relu(W f)``; ``a = softmax_n(w . (tanh(V h) * sigmoid(U h)))``;
    ``z = sum_n a_n h_n``; ``prediction = softmax(C z)``.

    Args:
        feature_dim: ``D``, the tile features' width.
        embedding_dim: ``E``, the slide embedding's width.
        classes: ``C``.
        hidden: Width of the attention branch.
    """

    def __init__(self, feature_dim: int, embedding_dim: int, classes: int, hidden: int = 256):
        super().__init__()
        self.feature_dim = feature_dim
        self.project = nn.Sequential(nn.Linear(feature_dim, embedding_dim), nn.ReLU())
        self.attention_v = nn.Linear(embedding_dim, hidden)
        self.attention_u = nn.Linear(embedding_dim, hidden)
        self.attention_w = nn.Linear(hidden, 1)
        self.classifier = nn.Linear(embedding_dim, classes)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.project(features)
        gate = torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))
        attention = torch.softmax(self.attention_w(gate).squeeze(-1), dim=0)
        embedding = attention @ h
        prediction = torch.softmax(self.classifier(embedding), dim=-1)
        return prediction, attention, embedding


class MeanPool(nn.Module):
    """The mean of a slide's tile features, and the uniform attention that gives it."""

    def __init__(self, feature_dim: int):
        super().__init__()
        self.feature_dim = feature_dim

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attention = torch.ones_like(features[:, 0]) / features.shape[0]
        return attention, features.mean(dim=0)
