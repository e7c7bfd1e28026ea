"""Fixtures for the chart, manifests and Dockerfile tests (helpers in helpers.py).

The real ``helm`` binary (``.tools/bin/helm`` under the repository root, else
``helm`` on PATH), no cluster; KServe CRD schemas from ``../shared/kserve-crds``
or ``$HISTOSERVE_KSERVE_CRDS``. A missing prerequisite fails the test with a
clear message when ``CI=true`` and skips it with the reason elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from tests.chart.helpers import (
    HelmError,
    find_helm,
    helm_template,
    missing,
    parse_docs,
    template_key,
)
from tests.chart.validators import check_object, load_crd_validators


@pytest.fixture(scope="session")
def helm_bin() -> str:
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    return helm


@pytest.fixture(scope="session")
def render(helm_bin: str) -> Callable[..., list[dict]]:
    """render(values=[ci file names], set_json={path: value}, ...) -> objects."""

    def _render(**kwargs: Any) -> list[dict]:
        return parse_docs(helm_template(helm_bin, template_key(**kwargs)))

    return _render


@pytest.fixture(scope="session")
def render_error(helm_bin: str) -> Callable[..., str]:
    """Renders values that must be refused; returns helm's error text."""

    def _render_error(**kwargs: Any) -> str:
        try:
            helm_template(helm_bin, template_key(**kwargs))
        except HelmError as exc:
            return exc.stderr
        raise AssertionError(f"helm template accepted values that must be refused: {kwargs}")

    return _render_error


@pytest.fixture(scope="session")
def crd_validators() -> dict:
    """The KServe kinds' strict CRD validators (:func:`tests.chart.validators.load_crd_validators`)."""
    return load_crd_validators()


@pytest.fixture(scope="session")
def validate_object(crd_validators) -> Callable[[dict], None]:
    """Validates one rendered object against its schema; raises on any problem."""
    return functools.partial(check_object, crd_validators=crd_validators)
