"""The Grafana dashboard: shipped as the sidecar's ConfigMap when asked, whole and well formed.

Its queries are evaluated on a real Prometheus scraping real servers in
``tests/integration/test_prometheus_queries.py``; here: the ConfigMap, and the
JSON's shape (every panel drawn from the Prometheus data source variable, every
target a query, no two panels on one spot, the panels the operators asked for).
"""

from __future__ import annotations

import json

from tests.chart.helpers import CHART, FULLNAME, NAMESPACE, by_kind

DASHBOARD = CHART / "dashboards" / "histoserve.json"
ASKED = (  # issue 52: what a platform team reads first
    "Throughput",
    "Tiles by outcome",
    "Queue depth by model",
    "Queue wait by model",
    "Batch size",
    "Forward time",
    "Request latency",
    "Device memory",
    "Device utilisation",
    "Replicas",
)


def _dashboards(objs: list[dict]) -> list[dict]:
    return [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_no_dashboard_unless_enabled(render):
    assert _dashboards(render()) == []


def test_the_dashboard_ships_whole_with_the_sidecar_label(render, validate_object):
    (config_map,) = _dashboards(render(set_json={"metrics.dashboard.enabled": True}))
    validate_object(config_map)
    meta = config_map["metadata"]
    assert meta["name"] == f"{FULLNAME}-dashboard"
    assert meta["namespace"] == NAMESPACE
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["labels"]["app.kubernetes.io/instance"] == "hs"
    assert json.loads(config_map["data"]["histoserve.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_namespace_labels_and_folder(render, validate_object):
    (config_map,) = _dashboards(
        render(
            set_json={
                "metrics.dashboard.enabled": True,
                "metrics.dashboard.namespace": "monitoring",
                "metrics.dashboard.labels": {"grafana_dashboard": "histo"},
                "metrics.dashboard.annotations": {"grafana_folder": "histoserve"},
            }
        )
    )
    validate_object(config_map)
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "histo"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "histoserve"}


def test_schema_refuses_a_bad_dashboard_value(render_error):
    err = render_error(set_json={"metrics.dashboard.enable": True})
    assert "enable" in err
    err = render_error(set_json={"metrics.dashboard.namespace": "Not_A_Namespace"})
    assert "namespace" in err


def test_dashboard_json_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "histoserve" and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(set(titles)) == len(titles)
    for asked in ASKED:
        assert any(t.startswith(asked) for t in titles), asked
    cells: set[tuple[int, int]] = set()
    ids = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
    assert len(ids) == len(dashboard["panels"])
