"""A lab's own slide head for ``histoserve export --module``: one attention branch per class."""

from __future__ import annotations

import torch
from torch import nn

from predictor.spec import ModelSpec


class PerClassAttention(nn.Module):
    """CLAM-style multi-branch attention: ``(prediction [C], attention [N, C], slide_embedding [E])``."""

    def __init__(self, feature_dim: int, embedding_dim: int, classes: int):
        super().__init__()
        self.project = nn.Sequential(nn.Linear(feature_dim, embedding_dim), nn.ReLU())
        self.score = nn.Linear(embedding_dim, classes)
        self.classify = nn.Linear(embedding_dim, 1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.project(features)
        attention = torch.softmax(self.score(h), dim=0)
        per_class = attention.transpose(0, 1) @ h
        prediction = torch.sigmoid(self.classify(per_class).squeeze(-1))
        return prediction, attention, per_class.mean(dim=0)


def build(spec: ModelSpec) -> nn.Module:
    """The factory ``--module tests.integration.slide_heads:build`` names (seeded weights)."""
    torch.manual_seed(7)
    return PerClassAttention(spec.feature_dim, spec.embedding_dim, len(spec.classes)).eval()
