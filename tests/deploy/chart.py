"""Renders and lints deploy/chart with Helm's own engine (helm-python-sdk: Helm v4 as a
library, offline, no cluster), for the chart tests. Owns nothing but the rendering: the chart
lives in deploy/chart, the values files the tests use in tests/deploy/chart_values."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import helm_python as helm

from tests.deploy.manifests import ROOT, load_all

CHART = ROOT / "deploy" / "chart"
VALUES = Path(__file__).resolve().parent / "chart_values"
NAMESPACE = "kube-flannel"
RELEASE = "flannel"


def values_file(name: str) -> dict[str, Any]:
    """A values file under tests/deploy/chart_values, parsed as Helm parses `-f`."""
    return helm.values_from_yaml((VALUES / f"{name}.yaml").read_text())


def render_text(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path to rendered text, as `helm template` (and an install) would make it.
    Raises helm.HelmValuesError (schema) or helm.HelmRenderError (a template's fail)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def refusals(each_values: Iterable[dict[str, Any]]) -> list[str]:
    """For each values dict, what Helm refuses it with (its schema's or a template's
    message), "" when it renders; the chart loaded once for all of them."""
    out = []
    with helm.Chart.load(CHART) as chart:
        for values in each_values:
            try:
                chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
            except (helm.HelmValuesError, helm.HelmRenderError) as err:
                out.append(str(err) or type(err).__name__)
            else:
                out.append("")
    return out


def render(values: dict[str, Any] | None = None) -> dict[str, dict]:
    """The rendered objects, keyed "Kind/name" like tests.deploy.manifests.documents."""
    docs: dict[str, dict] = {}
    for path, text in render_text(values).items():
        if not path.endswith(".yaml"):
            continue
        for doc in load_all(text):
            if doc:
                key = f"{doc['kind']}/{doc['metadata']['name']}"
                assert key not in docs, f"{key} rendered twice"
                docs[key] = doc
    return docs


def notes(values: dict[str, Any] | None = None) -> str:
    return next(text for path, text in render_text(values).items()
                if path.endswith("NOTES.txt"))


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """`helm lint --strict` of the chart with these values: its report."""
    return helm.lint(CHART, values or {}, strict=True, namespace=NAMESPACE)


def chart_values() -> dict[str, Any]:
    """The chart's default values (values.yaml)."""
    with helm.Chart.load(CHART) as chart:
        return chart.values


def chart_metadata() -> dict[str, Any]:
    with helm.Chart.load(CHART) as chart:
        return chart.metadata


def chart_schema() -> dict[str, Any]:
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    assert schema is not None
    return schema
