"""The Kubernetes manifests and the Slurm script: they parse, the manifests match the Kubernetes
API schemas, they start the right commands (the head, `zrl host` agents; `zrl start` in the
Slurm script) with the right broker address, and the broker Service covers the broker's
ports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from zrl.config.experiment import config_from_dict
from zrl.config.sections import DEFAULT_STREAMS
from zrl.testing.processes import REPO
from zrl.transport.endpoints import broker_endpoints

K8S = REPO / "launchers" / "k8s"
SBATCH = REPO / "launchers" / "slurm.sbatch"
BROKER = "tcp://zrl-broker:5555"
ROLE_FILES = {
    "params": "params.yaml",
    "replay": "replay.yaml",
    "learner": "learner.yaml",
    "evaluator": "evaluator.yaml",
    "actor": "actors.yaml",
}


def _docs() -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
        for p in sorted(K8S.glob("*.yaml"))
    }


def _workloads() -> list[dict[str, Any]]:
    return [d for docs in _docs().values() for d in docs if d["kind"] in ("Deployment", "Job")]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [
        d
        for docs in _docs().values()
        for d in docs
        if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def _run_entrypoint(
    container: dict[str, Any], tmp_path: Path, env: dict[str, str], keys: Path | None = None
) -> list[str]:
    """Run the container's shell entrypoint with a stub `zrl` that prints its arguments."""
    assert container["command"] == ["sh", "-c"]
    script = container["args"][0]
    if keys is not None:
        script = script.replace("/keys", str(keys))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "zrl"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    stub.chmod(0o755)
    container_env = {e["name"]: e["value"] for e in container.get("env", [])}
    done = subprocess.run(
        ["sh", "-c", script],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **container_env, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.splitlines()


def test_every_manifest_parses_and_kustomize_lists_them() -> None:
    docs = _docs()
    assert set(docs) >= {
        "broker.yaml",
        "configmap.yaml",
        "kustomization.yaml",
        *ROLE_FILES.values(),
    }
    for name, items in docs.items():
        assert items, name
        for d in items:
            assert d["apiVersion"] and d["kind"], name
            if d["kind"] != "Kustomization":
                assert d["metadata"]["name"].startswith("zrl-"), name
    resources = docs["kustomization.yaml"][0]["resources"]
    assert sorted(resources) == sorted(n for n in docs if n != "kustomization.yaml")


def test_every_workload_runs_zrl_against_the_service(tmp_path: Path) -> None:
    roles = {}
    for w in _workloads():
        role = w["metadata"]["labels"]["app.kubernetes.io/component"]
        roles[role] = w
        spec = w["spec"]
        if w["kind"] == "Deployment":
            assert (
                spec["selector"]["matchLabels"].items()
                <= spec["template"]["metadata"]["labels"].items()
            )
            assert spec["strategy"]["type"] == "Recreate"  # never two processes with one id
        c = _container(w)
        command = "zrl start broker" if role == "broker" else "zrl host"  # the head, the agents
        assert command in " ".join(c["command"] + c["args"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["keys"] == "/keys"
        if role == "broker":
            continue
        argv = _run_entrypoint(c, tmp_path, {"JOB_COMPLETION_INDEX": "3"})
        index = "3" if role == "actor" else "0"
        assert argv == [
            "host",
            f"{role}=1@{index}",
            "--broker",
            BROKER,
            "--connect-timeout",
            "600",
            "--log-dir",
            "/tmp/zrl-logs",
        ]
        keys = tmp_path / "keys"
        keys.mkdir(exist_ok=True)
        (keys / "server.key").write_text("")
        argv = _run_entrypoint(c, tmp_path, {"JOB_COMPLETION_INDEX": "3"}, keys=keys)
        assert argv[-2:] == ["--keys", str(keys)]
    assert set(roles) == {"broker", *ROLE_FILES}


def test_broker_binds_the_base_port_and_the_service_covers_the_layout(tmp_path: Path) -> None:
    deployment = _one("Deployment", "zrl-broker")
    service = _one("Service", "zrl-broker")
    container = _container(deployment)
    argv = _run_entrypoint(container, tmp_path, {})
    assert argv == [
        "start",
        "broker",
        "--run-dir",
        "/runs/cartpole_apex_dqn",
        "--config",
        "/config/config.yaml",
        "--bind",
        "tcp://0.0.0.0:5555",
        "--insecure",
    ]
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "server.key").write_text("")
    assert _run_entrypoint(container, tmp_path, {}, keys=keys)[-2:] == ["--keys", str(keys)]

    config = yaml.safe_load(_one("ConfigMap", "zrl-config")["data"]["config.yaml"])
    streams = config.get("broker", {}).get("streams", list(DEFAULT_STREAMS))
    needed = {int(a.rsplit(":", 1)[1]) for a in broker_endpoints(BROKER, streams).values()}
    assert needed == set(range(5555, 5555 + 4 + 2 * len(streams)))  # + the bulk topic lane
    ports = service["spec"]["ports"]
    assert {p["port"] for p in ports} == needed
    assert all(p["targetPort"] == p["port"] for p in ports)
    assert {p["containerPort"] for p in container["ports"]} == needed
    assert all(len(p["name"]) <= 15 for p in ports)  # the Kubernetes limit on port names
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["metadata"]["name"] == BROKER.split("//")[1].split(":")[0]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "zrl-config"


def test_config_map_is_a_valid_config_matching_the_workloads() -> None:
    config = config_from_dict(
        yaml.safe_load(_one("ConfigMap", "zrl-config")["data"]["config.yaml"])
    )
    job = _one("Job", "zrl-actor")["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == config.roles.actors
    for role, key in (
        ("replay", "replay"),
        ("learner", "learners"),
        ("params", "params"),
        ("evaluator", "evaluator"),
    ):
        assert _one("Deployment", f"zrl-{role}")["spec"]["replicas"] == getattr(config.roles, key)
    # relative: under every role pod's working directory, its default checkpoint root
    assert config.checkpoint.dir is not None and not Path(config.checkpoint.dir).is_absolute()


HEAD = ["--bind", "tcp://0.0.0.0:5555", "--insecure"]


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        ({}, ["start", "broker", "--run-dir", "RUN", "--config", "/config/config.yaml", *HEAD]),
        ({"config.yaml": "name: x\n"}, ["start", "broker", "--resume", "RUN", *HEAD]),
        (
            {"config.yaml": "", "summary.json": '{\n  "stop_reason": "interrupted"\n}'},
            ["start", "broker", "--resume", "RUN", *HEAD],
        ),
        (
            {"config.yaml": "", "summary.json": '{\n  "stop_reason": "eval_return"\n}'},
            ["sleep", "infinity"],
        ),
        (
            {
                "config.yaml": "",
                "summary.json": json.dumps(
                    {"stop_reason": "eval_return", "segments": [{"stop_reason": "interrupted"}]},
                    indent=2,
                ),
            },
            ["sleep", "infinity"],
        ),
    ],
    ids=["new-run", "head-restarted", "interrupted", "over", "over-after-a-resume"],
)
def test_the_head_starts_resumes_or_keeps_a_finished_run(
    tmp_path: Path, before: dict[str, str], expected: list[str]
) -> None:
    """The broker Deployment's head and its run directory on the `runs` volume: a new run, a
    resumed one after a restart mid-run, and a finished one it leaves alone (a Deployment
    restarts even a clean exit)."""
    deployment = _one("Deployment", "zrl-broker")
    container = _container(deployment)
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["ZRL_RUN_DIR"].startswith(mounts["runs"] + "/")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["runs"] or "persistentVolumeClaim" in volumes["runs"]

    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    for name, text in before.items():
        (run / name).write_text(text)
    here = {**container, "env": [*container["env"], {"name": "ZRL_RUN_DIR", "value": str(run)}]}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text('#!/bin/sh\necho sleep; for a in "$@"; do echo "$a"; done\n')
    (bin_dir / "sleep").chmod(0o755)
    argv = _run_entrypoint(here, tmp_path, {})
    want = [str(run) if a == "RUN" else a for a in expected]
    assert argv[-len(want) :] == want, argv
    assert ("start" in argv) == (want[0] == "start")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds() -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(done.stdout))
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "Job",
        "Service",
    ]


# --- the Kubernetes API schemas ----------------------------------------------------------
# kubernetes-validate (the test extra) ships the API's JSON schemas for each Kubernetes minor
# version, so this runs offline; "strict" schemas also reject fields the API does not have.
# kubectl cannot do this without a cluster: `kubectl apply --dry-run=client --validate=strict`
# downloads the schemas from the API server, `kubectl create --dry-run=client` needs it to
# map the kinds.
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")  # the oldest and the newest that package ships


def _schema_errors(directory: Path, version: str) -> list[str]:
    """Every API object in ``directory/*.yaml`` checked against the strict schemas of
    ``version``: one line per object that does not validate (the first error found in it)."""
    kv = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[test]'")
    errors = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None or doc["kind"] == "Kustomization":
                continue  # kustomize's own file, no API object: test_kustomize_builds
            name = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as err:
                where = ".".join(str(p) for p in err.absolute_path) or "(top)"
                errors.append(f"{name}: {where}: {err.message}")
            except kv.SchemaNotFoundError as err:
                errors.append(f"{name}: {err.message}")
    return errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_match_the_kubernetes_api_schemas(version: str) -> None:
    assert _schema_errors(K8S, version) == []


@pytest.mark.parametrize(
    ("name", "old", "new", "error"),
    [
        (
            "params.yaml",
            "imagePullPolicy:",
            "imagePulPolicy:",
            "params.yaml: Deployment zrl-params: spec.template.spec.containers.0: Additional "
            "properties are not allowed ('imagePulPolicy' was unexpected)",
        ),
        (
            "actors.yaml",
            "completions: 4",
            'completions: "4"',
            "actors.yaml: Job zrl-actor: spec.completions: '4' is not of type 'integer', 'null'",
        ),
        (
            "broker.yaml",
            "{name: registry, port: 5555,",
            "{name: registry,",
            "broker.yaml: Service zrl-broker: spec.ports.0: 'port' is a required property",
        ),
    ],
    ids=["unknown-field", "wrong-type", "missing-required"],
)
def test_schema_check_catches_a_broken_manifest(
    tmp_path: Path, name: str, old: str, new: str, error: str
) -> None:
    broken = tmp_path / "k8s"
    shutil.copytree(K8S, broken)
    text = (broken / name).read_text()
    assert text.count(old) == 1, old
    (broken / name).write_text(text.replace(old, new))
    assert _schema_errors(broken, KUBERNETES_VERSIONS[-1]) == [error]


# --- Slurm -------------------------------------------------------------------------------


def test_sbatch_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)


FAKE_SCONTROL = """#!/bin/sh
printf '%s\\n' nodeA nodeB nodeC
"""
FAKE_SRUN = """#!/bin/bash
echo "srun $*" >>"$FAKE_LOG"
while [ $# -gt 0 ] && [ "$1" != bash ]; do shift; done
SLURM_PROCID=0 exec "$@"
"""
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >>"$FAKE_LOG"
echo "pid $$" >>"$FAKE_LOG"
case "$*" in
  *"zrl status"*) exit 0 ;;
  *"zrl keys init"*) mkdir -p "$5" && touch "$5/server.key_secret"; exit 0 ;;
  *"start broker"*)  # the head: ends the job once the actors' agent runs (not just srun)
    for _ in $(seq 100); do grep -q "^python .*host .*actor=" "$FAKE_LOG" && exit 0; sleep 0.1; done
    exit 1 ;;
esac
exec sleep 30
"""


@pytest.mark.parametrize("keys", [None, "insecure", "/shared/zrl-keys"])
def test_sbatch_script_starts_the_roles_on_a_fake_allocation(
    tmp_path: Path, keys: str | None
) -> None:
    """Slurm's commands are stubs that log; the head's stub exits once the actors' agent
    runs, which ends the job as a met `stop` rule would: every other process must then be
    stopped, and the job's exit code is the head's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "SLURM_JOB_NODELIST": "node[A-C]",
        "SLURM_JOB_ID": "42",
        "BROKER_HOST": "nodeA",
        "PYTHON": str(bin_dir / "python"),
        "ACTORS_PER_NODE": "2",
        "EXTRA_SET": "env.num_envs=4 seed=7",
        "AGENT_GRACE": "1",  # the stub agents never end by themselves
        "HOME": str(tmp_path),
        **({"KEYS": keys} if keys else {}),
    }
    done = subprocess.run(
        ["bash", str(SBATCH)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "zrl-42").is_dir()
    lines = log.read_text().splitlines()
    calls = [line.split(" ", 1)[1] for line in lines if line.startswith("python ")]
    srun = [line for line in lines if line.startswith("srun ")]
    # No KEYS: the job makes its own keys (authenticated by default); KEYS=insecure: none.
    made = [c for c in calls if c.startswith("-m zrl keys init")]
    assert made == (["-m zrl keys init zrl-42/keys"] if keys is None else []), calls
    used = "zrl-42/keys" if keys is None else keys
    k = "" if used == "insecure" else f" --keys {used}"
    broker = [c for c in calls if c.startswith("-m zrl start broker")]
    assert broker == [
        "-m zrl start broker --run-dir zrl-42/run --bind tcp://0.0.0.0:5555 "
        "--config configs/cartpole_apex_dqn.yaml "
        "--set roles.actors=4 --set roles.replay=1 --set roles.learners=1 --set roles.params=1 "
        "--set roles.evaluator=1 --set env.num_envs=4 --set seed=7" + (k or " --insecure")
    ]
    # the head runs in the background: its stub may log after the first status call
    status = calls.index(f"-m zrl status --broker tcp://nodeA:5555 --timeout 1{k}")
    central = (
        f"-m zrl host --broker tcp://nodeA:5555 --log-dir zrl-42{k} "
        "params=1@0 replay=1@0 learner=1@0 evaluator=1@0"
    )
    assert central in calls, calls
    assert calls.index(central) > status  # started once the broker answered
    actors = f"-m zrl host --broker tcp://nodeA:5555 --log-dir zrl-42{k} actor=2@0"
    assert actors in calls, calls  # the fake srun runs task 0 only
    assert len(srun) == 1
    for part in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--ntasks=2",
        "--exclude nodeA",
        "--output=zrl-42/host-actors-%t.log",
    ):
        assert part in srun[0], srun[0]
    pids = [int(line.split()[1]) for line in lines if line.startswith("pid ")]
    # head, status, the central agent, the actors' agent (and the keys it made)
    assert len(pids) == 4 + (keys is None)
    left = [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not left, "the job left processes running"
