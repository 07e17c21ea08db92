"""Prometheus text-format metrics without a dependency: counters, gauges, one latency histogram."""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""


class Metrics:
    def __init__(self, prefix: str = "clawr1_gateway"):
        self.prefix = prefix
        self.counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self.gauges: dict[str, Callable[[], float]] = {}
        self.counted: dict[str, Callable[[], float]] = {}
        self.help: dict[str, str] = {}
        self.hist_counts: dict[tuple, list[int]] = {}
        self.hist_sum: dict[tuple, float] = defaultdict(float)

    def inc(self, name: str, value: float = 1.0, help: str = "", **labels: str) -> None:
        self.counters[name][tuple(sorted(labels.items())) if labels else ()] += value
        if help:
            self.help.setdefault(name, help)

    def gauge(self, name: str, fn: Callable[[], float], help: str = "") -> None:
        self.gauges[name] = fn
        self.help[name] = help

    def counter_fn(self, name: str, fn: Callable[[], float], help: str = "") -> None:
        """A counter kept elsewhere (read when rendering)."""
        self.counted[name] = fn
        self.help[name] = help

    def observe(self, seconds: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts = self.hist_counts.setdefault(key, [0] * (len(LATENCY_BUCKETS) + 1))
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                counts[i] += 1
        counts[-1] += 1
        self.hist_sum[key] += seconds

    def value(self, name: str, **labels: str) -> float:
        return self.counters[name][tuple(sorted(labels.items()))]

    def render(self) -> str:
        out = []
        for name, series in sorted(self.counters.items()):
            full = f"{self.prefix}_{name}_total"
            out += [f"# HELP {full} {self.help.get(name, name)}", f"# TYPE {full} counter"]
            out += [f"{full}{_labels(k)} {v:g}" for k, v in sorted(series.items())]
        for name, fn in sorted(self.counted.items()):
            full = f"{self.prefix}_{name}_total"
            out += [f"# HELP {full} {self.help.get(name, name)}", f"# TYPE {full} counter", f"{full} {fn():g}"]
        for name, fn in sorted(self.gauges.items()):
            full = f"{self.prefix}_{name}"
            out += [f"# HELP {full} {self.help.get(name, name)}", f"# TYPE {full} gauge", f"{full} {fn():g}"]
        full = f"{self.prefix}_request_seconds"
        out += [f"# HELP {full} request latency", f"# TYPE {full} histogram"]
        for key, counts in sorted(self.hist_counts.items()):
            for bound, c in zip(LATENCY_BUCKETS, counts):
                out.append(f"{full}_bucket{_labels(key + (('le', f'{bound:g}'),))} {c}")
            out.append(f"{full}_bucket{_labels(key + (('le', '+Inf'),))} {counts[-1]}")
            out += [f"{full}_sum{_labels(key)} {self.hist_sum[key]:g}", f"{full}_count{_labels(key)} {counts[-1]}"]
        return "\n".join(out) + "\n"
