"""Shared set-up of the closed autoscaling loop tests: the chart's presets rendered, slides, manifests.

The InferenceService each run scales by is ``helm template`` of the chart's
own preset file (``charts/histoserve/presets/<name>.yaml``), rendered as the
chart tests render presets (a claim every node can mount), never a copy.
"""

from __future__ import annotations

from pathlib import Path

from harness.slides import aperio_svs, expected_coords
from tests.chart.helpers import (
    CHART,
    find_helm,
    helm_template,
    missing,
    one,
    parse_docs,
    template_key,
)

STEP = 448  # level-0 footprint of a 224 px tile at 0.5 um/px on a 0.25 um/px slide
PRESET_STORAGE = {"storage.pvc.existingClaim": "histo-models"}


def rendered_isvc(preset: str, sets: dict | None = None) -> dict:
    """The InferenceService of ``presets/<preset>.yaml`` (plus ``sets``), from the real helm."""
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    key = template_key(values=[CHART / "presets" / f"{preset}.yaml"],
                       set_json={**PRESET_STORAGE, **(sets or {})})  # fmt: skip
    return one(parse_docs(helm_template(helm, key)), "InferenceService")


def cohort(root: Path, per_phase: list[int], files: int = 3) -> tuple[list[Path], dict[str, int]]:
    """One manifest a phase (``per_phase[i]`` slide ids over ``files`` real .svs), tiles per id."""
    root.mkdir(parents=True, exist_ok=True)
    slides = []
    for i in range(files):
        w, h = 8 + i % 3, 5 + i % 2  # tissue box in tiles: slides differ
        box = (STEP * (1 + i % 2), STEP, STEP * w, STEP * h)
        slides.append(
            aperio_svs(root / f"S{i}.svs", width=STEP * 12, height=STEP * 8, boxes=(box,))
        )
    tiles = [
        len(expected_coords(s.boxes, STEP, (0, 0, s.spec.width, s.spec.height))) for s in slides
    ]
    manifests, expected = [], {}
    for phase, count in enumerate(per_phase):
        lines = ["slide_id,path"]
        for k in range(count):
            sid = f"P{phase}-{k:03d}"
            lines.append(f"{sid},{slides[k % files].path}")
            expected[sid] = tiles[k % files]
        manifests.append(root / f"manifest-{phase}.csv")
        manifests[-1].write_text("\n".join(lines) + "\n")
    return manifests, expected
