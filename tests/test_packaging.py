"""What operators get: the sample configuration, the Dockerfile and docker-compose.yml agree with
the code and with each other."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from txmq.broker.config import BrokerConfig, key_name, load_config

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "config" / "broker.toml"
CONTAINER_CONFIG = "/etc/txmq/broker.toml"
DATA_DIR = "/var/lib/txmq"
#: The image the Dockerfile starts from unless told otherwise, made by tests/support/docker_base.sh.
BASE_IMAGE = "txmq-base:bookworm"
#: Where `make wheels` puts the wheels the image installs.
WHEELS = "build/wheels"
#: The folders txmq/ links to: txmq/protocol -> ../protocol, ...
SOURCE_FOLDERS = ("protocol", "broker", "client", "spark_connector")

#: Keys the sample sets to something other than the built-in default, and why.
ON_PURPOSE: dict[str, Any] = {
    "store_path_root_dir": DATA_DIR,  # the image's data volume
}


# --- config/broker.toml -----------------------------------------------------------------------


def test_sample_config_is_the_defaults_except_on_purpose() -> None:
    config = load_config(SAMPLE, env={})  # no TXMQ_* from the test's environment
    assert config == BrokerConfig(**ON_PURPOSE)
    for attr, value in ON_PURPOSE.items():
        assert getattr(BrokerConfig(), attr) != value, f"{attr} is not a deliberate change"


def test_sample_config_lists_every_key_once_in_its_section() -> None:
    doc = tomllib.loads(SAMPLE.read_text(encoding="utf-8"))
    assert list(doc) == ["broker", "store", "transaction", "operations"]
    listed: list[str] = [key for section in doc.values() for key in section]
    assert len(listed) == len(set(listed)), "a key appears in two sections"
    expected = {key_name(f.name) for f in dataclasses.fields(BrokerConfig)}
    assert set(listed) == expected, (
        f"missing from the sample: {sorted(expected - set(listed))}; "
        f"unknown: {sorted(set(listed) - expected)}"
    )
    assert doc["store"]["storePathRootDir"] == DATA_DIR
    assert "flushDiskType" in doc["store"] and "transactionTimeOut" in doc["transaction"]


def test_sample_config_explains_every_key() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z0-9]+\s*=", line):
            assert lines[i - 1].lstrip().startswith("#"), f"no explanation above: {line}"


# --- a tiny YAML reader: just what docker-compose.yml uses ------------------------------------


def _scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text if text else None


def parse_yaml_subset(source: str) -> Any:
    """Block mappings, block sequences of scalars, quoted or plain scalars, ``#`` comments.
    Anything else (flow collections, anchors, multi-line strings) raises ValueError, so the
    check fails loudly rather than reading the file wrongly."""
    lines: list[tuple[int, str]] = []
    for raw in source.splitlines():
        stripped = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not stripped.strip():
            continue
        if any(c in stripped for c in "{}[]&*|>") and not re.search(
            r"[\"'].*[{}\[\]].*[\"']", stripped
        ):
            raise ValueError(f"unsupported YAML: {raw!r}")
        lines.append((len(stripped) - len(stripped.lstrip(" ")), stripped.strip()))

    def block(pos: int, indent: int) -> tuple[Any, int]:
        if lines[pos][1].startswith("- "):
            items = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith("- "):
                items.append(_scalar(lines[pos][1][2:]))
                pos += 1
            return items, pos
        mapping: dict[str, Any] = {}
        while pos < len(lines) and lines[pos][0] == indent:
            key, sep, rest = lines[pos][1].partition(":")
            if not sep:
                raise ValueError(f"expected 'key:' at {lines[pos][1]!r}")
            pos += 1
            if rest.strip():
                mapping[key.strip()] = _scalar(rest)
            elif pos < len(lines) and lines[pos][0] > indent:
                mapping[key.strip()], pos = block(pos, lines[pos][0])
            else:
                mapping[key.strip()] = None
        return mapping, pos

    result, end = block(0, lines[0][0])
    if end != len(lines):
        raise ValueError(f"bad indentation at {lines[end][1]!r}")
    return result


def test_yaml_subset_reader() -> None:
    doc = parse_yaml_subset("a:\n  b: 'x'  # c\n  l:\n    - \"1:2\"\n    - y\nz:\n")
    assert doc == {"a": {"b": "x", "l": ["1:2", "y"]}, "z": None}
    with pytest.raises(ValueError):
        parse_yaml_subset("a: {b: 1}\n")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = parse_yaml_subset((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def interpolate(value: str, env: dict[str, str]) -> str:
    """docker-compose's ``${VAR:-default}`` (the only form the file uses)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)


def test_compose_broker_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    # Everything but the single broker is in the opt-in cluster profile: `docker-compose up`
    # starts the broker alone.
    assert [n for n, svc in services.items() if "cluster" not in svc.get("profiles", [])] == [
        "broker"
    ]
    broker = compose["services"]["broker"]
    assert broker["build"]["context"] == "."
    assert interpolate(broker["build"]["args"]["BASE_IMAGE"], {}) == BASE_IMAGE
    # Ports 10911 and 8081 (gRPC, on) unless TXMQ_HOST_PORT / TXMQ_GRPC_HOST_PORT publish them
    # elsewhere on the host.
    assert [interpolate(p, {}) for p in broker["ports"]] == ["10911:10911", "8081:8081"]
    moved = {"TXMQ_HOST_PORT": "20911", "TXMQ_GRPC_HOST_PORT": "28081"}
    assert [interpolate(p, moved) for p in broker["ports"]] == ["20911:10911", "28081:8081"]
    assert broker["environment"]["TXMQ_GRPC_SERVER_ENABLE"] == "true"
    assert broker["environment"]["TXMQ_BIND_ADDRESS"] == "0.0.0.0"
    assert broker["stop_signal"] == "SIGTERM"
    assert broker["stop_grace_period"] == "30s"
    # The grace period leaves the broker its own shutdown timeout.
    assert BrokerConfig().shutdown_timeout < 30


def test_compose_volumes(compose: dict[str, Any]) -> None:
    volumes = compose["services"]["broker"]["volumes"]
    named = [v for v in volumes if v.split(":")[1] == DATA_DIR]
    assert len(named) == 1
    name = named[0].split(":")[0]
    assert not name.startswith((".", "/")), "the data volume must be a named volume"
    assert name in compose["volumes"]
    assert f"./config/broker.toml:{CONTAINER_CONFIG}:ro" in volumes
    assert (ROOT / "config" / "broker.toml").is_file()


# --- Dockerfile -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile() -> dict[str, list[str]]:
    """Instruction -> its arguments (continuation lines joined), in order of appearance."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n\s*", " ", text)
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        out.setdefault(instruction.upper(), []).append(args.strip())
    return out


def _json_array(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def test_dockerfile_command(dockerfile: dict[str, list[str]]) -> None:
    (entrypoint,) = dockerfile["ENTRYPOINT"]
    (cmd,) = dockerfile["CMD"]
    argv = _json_array(entrypoint) + _json_array(cmd)
    assert argv == ["txmq", "broker", "--config", CONTAINER_CONFIG]
    assert shlex.join(argv) == "txmq broker --config /etc/txmq/broker.toml"


def test_dockerfile_base_is_a_build_argument(dockerfile: dict[str, list[str]]) -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=.*\nFROM \$\{BASE_IMAGE\}$", text, re.M), (
        "ARG BASE_IMAGE=... right before FROM ${BASE_IMAGE}"
    )
    assert dockerfile["ARG"] == [f"BASE_IMAGE={BASE_IMAGE}"]
    assert dockerfile["FROM"] == ["${BASE_IMAGE}"]
    # The script that builds the base image makes this one.
    script = (ROOT / "tests" / "support" / "docker_base.sh").read_text(encoding="utf-8")
    assert f"IMAGE={BASE_IMAGE}\n" in script


def test_dockerfile_installs_the_wheels_alone(dockerfile: dict[str, list[str]]) -> None:
    (copy,) = [c for c in dockerfile["COPY"] if c.split()[0] == WHEELS]
    target = copy.split()[1]
    (install,) = [r for r in dockerfile["RUN"] if "pip install" in r]
    assert "--no-index" in install, "no package index is reachable during the build"
    assert f"--find-links {target}" in install
    venv = re.search(r"python3 -m venv (\S+)", install)
    assert venv is not None, "the package goes into a virtual environment"
    assert f"{venv.group(1)}/bin/pip install" in install
    assert f"PATH={venv.group(1)}/bin:$PATH" in dockerfile["ENV"]
    # `make wheels` writes them where the Dockerfile takes them from.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"--wheel-dir {WHEELS} '.[broker,grpc,cluster]'" in makefile
    assert "'txmq[broker,grpc,cluster]'" in install


def test_dockerfile_image(dockerfile: dict[str, list[str]]) -> None:
    assert dockerfile["EXPOSE"] == ["10911 8081 9876"]
    assert _json_array(dockerfile["VOLUME"][0]) == [DATA_DIR]
    (user,) = dockerfile["USER"]
    assert user not in ("root", "0") and not user.startswith("0:")
    assert f"config/broker.toml {CONTAINER_CONFIG}" in dockerfile["COPY"]
    assert "TXMQ_BIND_ADDRESS=0.0.0.0" in " ".join(dockerfile["ENV"])
    assert "TXMQ_METRICS_PORT=9876" in " ".join(dockerfile["ENV"])
    assert dockerfile.get("STOPSIGNAL", ["SIGTERM"]) == ["SIGTERM"]


def _healthcheck(dockerfile: dict[str, list[str]]) -> tuple[dict[str, str], list[str]]:
    (health,) = dockerfile["HEALTHCHECK"]
    options, _, command = health.partition("CMD ")
    flags = dict(o.removeprefix("--").split("=", 1) for o in options.split())
    return flags, _json_array(command)


def test_dockerfile_healthcheck(dockerfile: dict[str, list[str]]) -> None:
    _, command = _healthcheck(dockerfile)
    assert command == ["txmq", "probe", "ready"]


def test_compose_healthcheck_is_the_dockerfiles(
    compose: dict[str, Any], dockerfile: dict[str, list[str]]
) -> None:
    flags, command = _healthcheck(dockerfile)
    health = compose["services"]["broker"]["healthcheck"]
    assert health["test"] == ["CMD", *command]
    assert {k: health[k.replace("-", "_")] for k in flags} == flags


def test_build_context_is_what_the_dockerfile_copies(dockerfile: dict[str, list[str]]) -> None:
    # .dockerignore leaves everything out (.git, .venv, data, build outputs) but what COPY takes.
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    assert all(p.startswith("!") for p in patterns[1:])
    copied = {c.split()[0] for c in dockerfile["COPY"]}
    assert {p[1:] for p in patterns[1:]} == copied
    assert (ROOT / "config" / "broker.toml").is_file()


def test_the_wheel_has_every_module(tmp_path: Path) -> None:
    """A module left out of the wheel works in the checkout but not where txmq is installed (the
    Docker image, a Spark node): every module of the source folders is in it, under txmq/."""
    src = tmp_path / "src"
    for name in ("txmq", *SOURCE_FOLDERS):
        # txmq/ keeps its relative links to the source folders, as in the repository
        shutil.copytree(
            ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copyfile(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp_path, src],
        check=True,
    )
    (wheel,) = tmp_path.glob("txmq-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = whl.read(meta).decode("utf-8")
    # the project's links, as PyPI shows them
    for label in ("Homepage", "Documentation", "Source", "Issues"):
        assert f"Project-URL: {label}, https://" in metadata, f"{label} link missing"
    shipped = {n for n in names if n.endswith(".py")}
    # PEP 561 marker, and the licence with the notice for the RocketMQ-derived .proto files
    assert "txmq/py.typed" in names, "py.typed missing: type checkers would ignore txmq's types"
    for name in ("LICENSE", "NOTICE"):
        assert any(n.endswith(f".dist-info/licenses/{name}") for n in names), f"{name} not shipped"
    # txmq/ itself and its own sub-packages (the CLI's txmq/cli/); rglob does not follow the links
    expected = {
        f"txmq/{p.relative_to(ROOT / 'txmq').as_posix()}" for p in (ROOT / "txmq").rglob("*.py")
    }
    for folder in SOURCE_FOLDERS:
        expected.update(
            f"txmq/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / folder).rglob("*.py")
        )
    assert sorted(expected - shipped) == [], "modules missing from the wheel"
    assert sorted(shipped - expected) == [], "files in the wheel that are no module of txmq"


def test_compose_cluster_profile(compose: dict[str, Any]) -> None:
    """Three etcd members and three replicas of group g1, each replica on its own port (the same
    inside and outside), replicating through its service name."""
    services = compose["services"]
    replicas = {n: s for n, s in services.items() if n.startswith("g1-")}
    assert sorted(replicas) == ["g1-0", "g1-1", "g1-2"]
    assert sorted(n for n in services if n.startswith("etcd")) == ["etcd1", "etcd2", "etcd3"]
    for name, svc in replicas.items():
        env = svc["environment"]
        assert env["TXMQ_ETCD_ENDPOINTS"] == "etcd1:2379,etcd2:2379,etcd3:2379"
        assert env["TXMQ_BROKER_IP2"] == name
        port = interpolate(env["TXMQ_LISTEN_PORT"], {})
        assert [interpolate(p, {}) for p in svc["ports"]] == [f"{port}:{port}"]
        assert svc["depends_on"] == ["etcd1", "etcd2", "etcd3"]


# --- pyproject.toml: links and the floors of the gRPC extras ---------------------------------


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _floors(extra: str) -> dict[str, tuple[int, ...]]:
    """``{distribution: floor}`` of an extra's ``name>=X`` requirements."""
    out = {}
    for req in _pyproject()["project"]["optional-dependencies"][extra]:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(?:,<\d+)?", req.split(";")[0].strip())
        if found:
            out[found.group(1)] = tuple(int(x) for x in found.group(2).split("."))
    return out


def test_project_urls() -> None:
    urls = _pyproject()["project"]["urls"]
    assert sorted(urls) == ["Documentation", "Homepage", "Issues", "Source"]
    for label, url in urls.items():
        assert url.startswith("https://"), f"{label}: {url}"
    # the documentation is the docs/ folder of the source
    assert urls["Documentation"].startswith(urls["Source"])
    assert urls["Documentation"].endswith("/docs") and (ROOT / "docs").is_dir()
    assert urls["Issues"] == urls["Source"] + "/issues"


def test_grpc_floors_are_the_generators() -> None:
    """broker/grpc/vendor/v2 is generated by the grpcio-tools the Makefile pins; the grpc extra asks
    for its grpcio at least, and for the first protobuf with what broker/grpc/server.py reads
    (MethodDescriptor.client_streaming, protobuf 4.25)."""
    pinned = re.search(
        r"^GRPC_TOOLS := grpcio-tools==(\S+)$", (ROOT / "Makefile").read_text(), re.M
    )
    assert pinned, "the Makefile pins no grpcio-tools"
    tools = tuple(int(x) for x in pinned.group(1).split("."))
    floors = _floors("grpc")
    assert floors["grpcio"] == tools
    assert floors["protobuf"] == (4, 25, 0)
    assert not any(
        "grpcio-tools" in r for r in _pyproject()["project"]["optional-dependencies"]["dev"]
    )
    server = (ROOT / "broker" / "grpc" / "server.py").read_text(encoding="utf-8")
    assert ".client_streaming" in server, "the protobuf floor's reason is gone: lower it"


def test_cluster_floors_are_what_aetcd_checks_at_import() -> None:
    """aetcd's generated modules refuse, at import, a grpcio or protobuf older than the ones
    that generated them: the cluster extra asks for those at least."""
    aetcd = pytest.importorskip("aetcd", reason="aetcd (cluster extra) is not installed")
    rpc = Path(aetcd.__file__).resolve().parent / "rpc"
    grpc_needs = set(
        re.findall(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", _read_all(rpc, "*_pb2_grpc.py"))
    )
    pb_needs = set(re.findall(r"Protobuf Python Version: ([0-9.]+)", _read_all(rpc, "*_pb2.py")))
    floors = _floors("cluster")
    for needs, name in ((grpc_needs, "grpcio"), (pb_needs, "protobuf")):
        need = max((tuple(int(x) for x in v.split(".")) for v in needs), default=(0,))
        assert floors[name] >= need, f"{name} floor {floors[name]} below aetcd's {need}"
    assert floors["grpcio"] >= _floors("grpc")["grpcio"]


def _read_all(folder: Path, pattern: str) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob(pattern)))
