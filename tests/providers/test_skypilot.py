"""The skypilot provider up to SkyPilot's API boundary.

A cloud API cannot exist here (no account, no network), so these tests inject a FAKE ``sky``
module into ``sys.modules``: it records the Task and Resources the provider builds and the
calls it makes (launch with autodown, status, down), and answers like SkyPilot's client SDK
(request ids waited for with ``sky.get``) or like older versions (results directly). What
happens past that boundary (provisioning, the skylet's autostop) is SkyPilot's and is not
tested here; docs/remote-providers.md says how to try it with a real account.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sojourn.providers.base import (
    LaunchFailed,
    LaunchSpec,
    ProviderError,
    Requirements,
    get_provider,
)
from sojourn.providers.skypilot import SkyPilotProvider


class FakeSky(types.ModuleType):
    """Just enough of SkyPilot's surface: Task, Resources, launch, status, down, get."""

    def __init__(self, request_ids: bool = True, old_resources: bool = False):
        super().__init__("sky")
        self.calls: list[tuple[str, Any]] = []
        self.clusters: dict[str, str] = {}
        self.request_ids = request_ids
        self.results: dict[str, Any] = {}
        self.fail_launch: BaseException | None = None
        sky = self

        class Task:
            def __init__(self, name: str | None = None, setup: str | None = None, run: str | None = None,
                         envs: dict[str, str] | None = None, workdir: str | None = None):
                self.name, self.setup, self.run, self.envs = name, setup, run, envs or {}
                self.resources: Any = None

            def set_resources(self, r: Any) -> Task:
                self.resources = r
                return self

        class Resources:
            def __init__(self, **kw: Any):
                if old_resources and "infra" in kw:
                    raise TypeError("Resources.__init__() got an unexpected keyword argument 'infra'")
                self.kw = kw

        class _Registry:
            @staticmethod
            def from_str(name: str) -> str:
                return f"<cloud {name}>"

        self.Task = Task
        self.Resources = Resources
        self.clouds = types.SimpleNamespace(CLOUD_REGISTRY=_Registry())
        self._sky = sky

    def _answer(self, value: Any) -> Any:
        if not self.request_ids:
            return value
        rid = f"req-{len(self.results)}"
        self.results[rid] = value
        return rid

    def get(self, request_id: str) -> Any:
        self.calls.append(("get", request_id))
        return self.results.pop(request_id)

    def launch(self, task: Any, cluster_name: str | None = None, retry_until_up: bool = False,
               idle_minutes_to_autostop: int | None = None, down: bool = False, **kw: Any) -> Any:
        self.calls.append(("launch", {"task": task, "cluster_name": cluster_name, "idle": idle_minutes_to_autostop,
                                      "down": down, "retry_until_up": retry_until_up, **kw}))
        if self.fail_launch is not None:
            raise self.fail_launch
        assert cluster_name is not None
        self.clusters[cluster_name] = "UP"
        return self._answer((1, {"cluster_name": cluster_name}))

    def status(self, cluster_names: list[str] | None = None, refresh: bool = False) -> Any:
        self.calls.append(("status", cluster_names))
        names = cluster_names or list(self.clusters)
        recs = [{"name": n, "status": types.SimpleNamespace(name=self.clusters[n])} for n in names
                if n in self.clusters]
        return self._answer(recs)

    def down(self, cluster_name: str) -> Any:
        self.calls.append(("down", cluster_name))
        self.clusters.pop(cluster_name, None)
        return self._answer(None)


@pytest.fixture
def fake_sky(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSky]:
    sky = FakeSky()
    monkeypatch.setitem(sys.modules, "sky", sky)
    yield sky


def _spec(**kw: Any) -> LaunchSpec:
    return LaunchSpec("ws_0123456789ab", "al_fedcba987654", ["python3", "-m", "sojourn.workspace.supervise",
                                                             "--repo", "s3://b/p", "--workspace", "ws_0123456789ab"],
                      env={"SOJOURN_REPO": "s3://b/p", "AWS_REGION": "us-east-1"}, **kw)


def test_offers_come_from_the_catalog_as_skypilot_offers() -> None:
    p = SkyPilotProvider(None, config={"clouds": ["aws", "gcp"]})
    offers = p.offers(Requirements(gpus=1, gpu="A100"))
    assert offers and all(o.provider == "skypilot" and o.name.split(":")[0] in ("aws", "gcp") for o in offers)
    assert all(o.extra["cloud"] in ("aws", "gcp") and o.gpus >= 1 for o in offers)
    assert [o.price for o in offers] == sorted(o.price for o in offers)
    spot = [o for o in offers if o.spot]
    assert spot and all(o.name.endswith(":spot") and o.notice_s for o in spot)
    assert p.offers(Requirements(provider="slurm")) == []


def test_launch_builds_task_and_resources_and_sets_autodown(fake_sky: FakeSky) -> None:
    p = SkyPilotProvider(None, config={"idle_minutes": 3, "setup": "pip install sojourn==0.1.0"})
    offer = next(o for o in p.offers(Requirements(provider="skypilot")) if o.spot and o.extra["cloud"] == "aws")
    h = p.launch(offer, _spec(hard_stop=7200, cwd="/tmp/sj"))
    [(_kind, call)] = [c for c in fake_sky.calls if c[0] == "launch"]
    task = call["task"]
    assert task.setup == "pip install sojourn==0.1.0"
    assert task.run.startswith("mkdir -p /tmp/sj && cd /tmp/sj && exec timeout -s TERM -k 60s 7200s python3 -m "
                               "sojourn.workspace.supervise")
    assert task.envs["SOJOURN_REPO"] == "s3://b/p" and task.envs["SOJOURN_ALLOCATION"] == "al_fedcba987654"
    kw = task.resources.kw
    assert kw == {"infra": f"aws/{offer.region}", "instance_type": offer.extra["instance_type"], "use_spot": True}
    assert call["idle"] == 3 and call["down"] is True and call["retry_until_up"] is False
    assert h.data["cluster"] == "sj-01234567-fedcba98" and h.data["job_id"] == 1 and h.data["spot"] is True
    assert ("get", "req-0") in fake_sky.calls  # the client SDK's request id was waited for
    # status, then terminate (sky.down), then ended; a second terminate does nothing.
    assert p.status(h) == "running"
    fake_sky.clusters[h.data["cluster"]] = "INIT"
    assert p.status(h) == "pending"
    fake_sky.clusters[h.data["cluster"]] = "UP"
    p.terminate(h)
    assert ("down", h.data["cluster"]) in fake_sky.calls
    assert p.status(h) == "ended"
    n = len(fake_sky.calls)
    p.terminate(h)
    assert [c[0] for c in fake_sky.calls[n:]] == ["status", "get"]


def test_older_skypilot_results_and_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    sky = FakeSky(request_ids=False, old_resources=True)
    monkeypatch.setitem(sys.modules, "sky", sky)
    p = SkyPilotProvider(None)
    offer = next(o for o in p.offers(Requirements()) if o.extra["cloud"] == "gcp" and not o.spot)
    h = p.launch(offer, _spec())
    task = next(c[1]["task"] for c in sky.calls if c[0] == "launch")
    assert task.resources.kw == {"cloud": "<cloud gcp>", "region": offer.region,
                                 "instance_type": offer.extra["instance_type"], "use_spot": False}
    # no hard stop asked; no setup configured: the environment is built by uv on the VM
    assert task.run.startswith('exec "$HOME"/.cache/sojourn/envs/')
    assert "/bin/python -m sojourn.workspace.supervise" in task.run
    assert "uv venv" in task.setup and "'sojourn[numpy]'" in task.setup
    assert not any(c[0] == "get" for c in sky.calls)
    assert p.status(h) == "running"


def test_launch_errors_name_the_check(fake_sky: FakeSky) -> None:
    p = SkyPilotProvider(None)
    offer = p.offers(Requirements())[0]

    class ResourcesUnavailableError(Exception):
        pass

    class NoCloudAccessError(Exception):
        pass

    for exc, check in ((ResourcesUnavailableError("no capacity in us-east-1"), "capacity"),
                       (NoCloudAccessError("aws credentials not found"), "permission"),
                       (RuntimeError("boom"), "launch")):
        fake_sky.fail_launch = exc
        with pytest.raises(LaunchFailed) as e:
            p.launch(offer, _spec())
        assert e.value.check == check and type(exc).__name__ in str(e.value)


def test_without_skypilot_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # makes `import sky` fail
    p = get_provider("skypilot", None)
    assert isinstance(p, SkyPilotProvider)
    assert p.offers(Requirements())  # offers need no SkyPilot
    with pytest.raises(ProviderError, match="pip install 'skypilot"):
        _ = p.sky
    with pytest.raises(LaunchFailed, match="pip install 'skypilot") as e:
        p.launch(p.offers(Requirements())[0], _spec())
    assert e.value.check == "permission"
