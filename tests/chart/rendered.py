"""Accessors into a rendered chart (a list of objects), shared by the value-by-value tests."""

from __future__ import annotations

from typing import Any

from tests.chart.helpers import one


def isvc(objs: list[dict]) -> dict:
    """The one ``InferenceService``."""
    return one(objs, "InferenceService")


def pred(objs: list[dict]) -> dict:
    """The InferenceService's ``spec.predictor``."""
    return isvc(objs)["spec"]["predictor"]


def env_of(container: dict) -> dict[str, Any]:
    """A container's environment as ``{name: value}`` (None for ``valueFrom``)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mounts_of(container: dict) -> dict[str, dict]:
    """A container's volume mounts by mount path."""
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes_of(objs: list[dict]) -> dict[str, dict]:
    """The predictor's volumes by name."""
    return {v["name"]: v for v in pred(objs).get("volumes", [])}
