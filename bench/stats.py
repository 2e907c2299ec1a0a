"""Medians, percentiles and spreads of repeated measurements."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, round(p / 100 * len(ordered) + 0.5))
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class Figure:
    """One reported number: the median of repeated runs and their spread."""

    key: str
    runs: list[float] = field(default_factory=list)
    # When set, the headline is this value (e.g. a p99 over all samples pooled) instead of the
    # median of the runs; the runs still give the spread.
    headline: float | None = None
    unit: str = ""

    @property
    def value(self) -> float:
        if self.headline is not None:
            return self.headline
        return statistics.median(self.runs) if self.runs else float("nan")

    def detail(self) -> dict[str, Any]:
        return {
            "median": _round(statistics.median(self.runs)) if self.runs else None,
            "min": _round(min(self.runs)) if self.runs else None,
            "max": _round(max(self.runs)) if self.runs else None,
            "runs": [_round(r) for r in self.runs],
            "unit": self.unit,
        }


def _round(value: float) -> float:
    return float(f"{value:.4g}")


class Results:
    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}

    def add(self, key: str, value: float, unit: str = "") -> None:
        figure = self.figures.setdefault(key, Figure(key, unit=unit))
        figure.runs.append(value)

    def set_headline(self, key: str, value: float) -> None:
        self.figures[key].headline = value

    def values(self) -> dict[str, float]:
        return {key: _round(f.value) for key, f in self.figures.items()}

    def details(self) -> dict[str, dict[str, Any]]:
        return {key: f.detail() for key, f in self.figures.items()}
