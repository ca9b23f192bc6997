"""The Prometheus alert rules of docker-compose (deploy/prometheus/alerts.yml) are valid, and each fires on
the series that should fire it and not before its ``for`` (promtool's own rule unit tests:
deploy/prometheus/alerts_test.yml). promtool comes with Debian's prometheus package (.ci/run installs it)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

DEPLOY = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run does)")
    return subprocess.run([binary, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=120)


def test_the_rules_and_the_scrape_config_are_valid():
    rules = _promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "4 rules found" in rules.stdout
    config = _promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_each_alert_fires_when_it_should():
    done = _promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alerts_use_metrics_the_services_export():
    """Every mqstore_* name in the rules is registered by some module (a renamed metric breaks this)."""
    import re
    names = set(re.findall(r"\b(mqstore_[a-z_]+)\b", (DEPLOY / "alerts.yml").read_text()))
    source = "\n".join(p.read_text() for p in (DEPLOY.parents[1] / "core" / "mqstore").rglob("*.py"))
    assert names and all(f'"{name}"' in source for name in names), names
