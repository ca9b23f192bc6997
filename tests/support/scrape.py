"""Reading a service's /metrics over HTTP, parsed by prometheus-client's own text parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape: ``value(name, **labels)`` sums the samples of ``name`` whose labels include these."""

    def __init__(self, text: str):
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        wanted = {k: str(v) for k, v in labels.items()}
        return sum(s.value for s in self.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items()))

    def has(self, name: str, **labels: str) -> bool:
        wanted = {k: str(v) for k, v in labels.items()}
        return any(s.name == name and all(s.labels.get(k) == v for k, v in wanted.items()) for s in self.samples)


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> Scrape:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as response:
        assert response.status == 200
        return Scrape(response.read().decode("utf-8"))
