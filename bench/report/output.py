"""Results: the machine description, ``results.json``, ``results.md`` and the plots."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.profiles import Profile
from bench.report.results_md import markdown


def loadavg() -> list[float] | None:
    """The 1/5/15-minute load averages (``None`` where unavailable)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages / 2**30, 1)


def machine(profile: Profile) -> dict[str, Any]:
    """What the numbers were measured on, and with which thread settings."""
    import torch

    meta: dict[str, Any] = {
        "profile": profile.name,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kserve": version("kserve"),
        "device": profile.device,
        "threads": profile.threads,
        "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
    }
    if profile.device.startswith("cuda") and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
    return meta


def write(results: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    """Writes ``results.json``, ``results.md`` and (optionally) one PNG per model."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    png_names: dict[str, str] = {}
    if plots:
        from bench.report.plots import plot_model

        for label, model in results["models"].items():
            path = plot_model(label, model, out / f"{label}.png")
            png_names[label] = path.name
            written.append(path)
    json_path = out / "results.json"
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    md_path = out / "results.md"
    md_path.write_text(markdown(results, png_names), encoding="utf-8")
    return [json_path, md_path, *written]
