"""``skypilot``: cloud machines through SkyPilot's Python API (``pip install skypilot[aws]``
and ``sky check``; see docs/remote-providers.md).

Offers are the shipped price catalog's cloud rows (providers/catalog.py), renamed
``<cloud>:<instance type>@<region>[:spot]``. A launch builds one ``sky.Task`` (setup installs
sojourn on the VM, run is the sojourn supervisor command, ``envs`` its environment) with
``sky.Resources`` from the offer (cloud, region, instance type, spot), and calls
``sky.launch`` on a cluster of its own with autodown:

* the hard stop: the run command runs under coreutils' ``timeout`` (SIGTERM at the hard stop,
  so the supervisor pauses the session; SIGKILL a grace later), and the cluster is torn down
  ``idle_minutes`` after its job ends (``idle_minutes_to_autostop`` + ``down=True``; SkyPilot's
  agent on the VM enforces it). SkyPilot has no provider-side wall-clock limit yet;
* status: ``sky.status`` (UP → running, INIT → pending, STOPPED or gone → ended);
* terminate: ``sky.down``.

Recent SkyPilot (0.10+) returns request ids from these calls; they are waited for with
``sky.get``. Older versions return the results directly; both work. ``sky`` is imported on
first use only: the rest of sojourn never needs it.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import shlex
import time
from dataclasses import replace
from typing import Any

from sojourn.providers.base import (
    Handle,
    LaunchFailed,
    LaunchSpec,
    Offer,
    ProviderError,
    Requirements,
    Status,
    cheapest_first,
)
from sojourn.providers.slurm import provider_config

CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod")
DEFAULT_SOJOURN = "sojourn[numpy]"  # the requirement that installs sojourn on a VM (config: sojourn)
_ENV_ROOT = "$HOME/.cache/sojourn/envs"
_ENV_HOME = "/__sojourn_home__"  # stands for $HOME in the run line until it is quoted


def _is_python(arg: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", arg.rsplit("/", 1)[-1]) is not None
DEFAULT_IDLE_MINUTES = 5


def _cluster_name(workspace: str, allocation: str) -> str:
    # Cluster names: lower-case letters, digits and dashes, starting with a letter, short.
    raw = f"sj-{workspace.removeprefix('ws_')[:8]}-{allocation.removeprefix('al_')[:8]}".lower()
    return re.sub(r"[^a-z0-9-]", "-", raw)


class SkyPilotProvider:
    """Clouds through SkyPilot. ``sky_module``: an object that stands in for ``import sky``."""

    name = "skypilot"
    terminate_grace = 60.0

    def __init__(self, repo: Any = None, *, config: dict[str, Any] | None = None, sky_module: Any = None):
        self.repo = repo
        self.config = dict(config) if config is not None else provider_config(repo, "skypilot")
        self._sky = sky_module

    @property
    def sky(self) -> Any:
        if self._sky is None:
            try:
                self._sky = importlib.import_module("sky")
            except ImportError as e:
                raise ProviderError("the skypilot provider needs SkyPilot: pip install 'skypilot[aws,gcp]' (the "
                                    "clouds you use), then `sky check` (docs/remote-providers.md)") from e
        return self._sky

    def _result(self, value: Any) -> Any:
        """Wait for a request id (SkyPilot 0.10+ client SDK); pass results of older ones on."""
        get = getattr(self.sky, "get", None)
        if isinstance(value, str) and callable(get):
            return get(value)
        return value

    # -- offers --------------------------------------------------------------------------------

    def offers(self, req: Requirements) -> list[Offer]:
        if req.provider and req.provider != self.name:
            return []
        from sojourn.providers import catalog

        clouds = tuple(self.config.get("clouds") or CLOUDS)
        inner = replace(req, provider=None)
        out = []
        for o in catalog.load().offers(inner):
            if o.provider not in clouds:
                continue
            out.append(replace(o, provider=self.name, name=f"{o.provider}:{o.name}",
                               extra={**o.extra, "cloud": o.provider}))
        return cheapest_first(out)

    # -- launch --------------------------------------------------------------------------------

    def task(self, offer: Offer, spec: LaunchSpec) -> Any:
        """The ``sky.Task`` for ``spec`` on ``offer`` (with its resources set)."""
        sky = self.sky
        cloud = offer.extra.get("cloud") or offer.name.split(":", 1)[0]
        instance_type = offer.extra.get("instance_type") or offer.name.split(":", 1)[-1].split("@")[0]
        argv = list(spec.argv)
        setup = self.config.get("setup")
        if setup is None:
            # The environment the workspace's last capsule needs, built on the VM by uv (the
            # same requirements and key as `sojourn resume --build-env`), and the run uses it.
            setup, env_python = self._environment(spec)
            if argv and _is_python(argv[0]):
                argv[0] = env_python
        if spec.hard_stop:
            argv = ["timeout", "-s", "TERM", "-k", f"{int(self.terminate_grace)}s", f"{math.ceil(spec.hard_stop)}s",
                    *argv]
        run = shlex.join(argv).replace(shlex.quote(_ENV_HOME), '"$HOME"')
        if spec.cwd:
            run = f"mkdir -p {shlex.quote(spec.cwd)} && cd {shlex.quote(spec.cwd)} && exec {run}"
        else:
            run = f"exec {run}"
        task = sky.Task(name=f"sojourn-{spec.workspace}", setup=setup, run=run,
                        envs={**spec.env, "SOJOURN_ALLOCATION": spec.allocation})
        task.set_resources(_resources(sky, cloud, offer.region, instance_type, bool(offer.spot)))
        return task

    def _environment(self, spec: LaunchSpec) -> tuple[str, str]:
        """The setup script that builds what the workspace's last capsule needs (nothing but
        sojourn for a first run) on the recorded Python version, and its interpreter."""
        from sojourn.environment.build import setup_script

        packages: dict[str, Any] = {}
        python = self.config.get("python") or ""
        try:
            from sojourn.capsule import format as fmt
            from sojourn.workspace.store import WorkspaceStore

            rec = WorkspaceStore(self.repo).record(spec.workspace, save=False)
            if rec.last_capsule is not None:
                m = fmt.load_manifest(self.repo, rec.last_capsule.id)
                packages = m.packages
                python = python or ".".join(m.environment.get("python", "").split(".")[:2])
        except Exception:
            pass  # no repository or no capsule yet: the run's own environment is sojourn's
        script, env_python = setup_script(packages, python or "3.12", mode=self.config.get("env_mode", "exact"),
                                          sojourn=self.config.get("sojourn", DEFAULT_SOJOURN), root=_ENV_ROOT)
        return script, env_python.replace("$HOME", _ENV_HOME)

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        if offer.provider != self.name:
            raise LaunchFailed(f"offer {offer.name!r} is from provider {offer.provider!r}, not {self.name!r}", "catalog")
        if not spec.argv:
            raise LaunchFailed("nothing to launch: the command line is empty", "launch")
        try:
            task = self.task(offer, spec)
        except ProviderError as e:
            raise LaunchFailed(str(e), "permission") from e
        cluster = _cluster_name(spec.workspace, spec.allocation)
        idle = int(self.config.get("idle_minutes", DEFAULT_IDLE_MINUTES))
        try:
            result = self._result(_call(self.sky.launch, task, cluster_name=cluster, idle_minutes_to_autostop=idle,
                                        down=True, retry_until_up=False, detach_run=True, stream_logs=False))
        except Exception as e:  # SkyPilot's own exceptions: sort them into the four checks
            raise LaunchFailed(f"SkyPilot could not launch {offer.name}: {type(e).__name__}: {e}", _check_of(e)) from e
        job_id = result[0] if isinstance(result, tuple | list) and result else None
        return Handle(self.name, offer.name, spec.allocation,
                      {"cluster": cluster, "job_id": job_id, "cloud": offer.extra.get("cloud"),
                       "region": offer.region, "spot": offer.spot, "idle_minutes": idle,
                       "hard_stop": time.time() + spec.hard_stop if spec.hard_stop else None})

    # -- status, terminate -----------------------------------------------------------------------

    def status(self, handle: Handle) -> Status:
        cluster = handle.data["cluster"]
        try:
            records = self._result(self.sky.status(cluster_names=[cluster], refresh=True))
        except Exception:
            return "unknown"
        if not records:
            return "ended"  # torn down (autodown after the job, sky.down, or a preemption)
        rec = records[0]
        st = rec.get("status") if isinstance(rec, dict) else getattr(rec, "status", None)
        name = str(getattr(st, "name", st) or "").upper()
        if name == "UP":
            return "running"
        if name == "INIT":
            return "pending"
        if name == "STOPPED":
            return "ended"
        return "unknown"

    def terminate(self, handle: Handle) -> None:
        cluster = handle.data["cluster"]
        if self.status(handle) == "ended":
            return
        try:
            self._result(self.sky.down(cluster))
        except Exception as e:
            if "does not exist" in str(e).lower() or "not found" in str(e).lower():
                return
            raise ProviderError(f"sky.down({cluster!r}) failed: {e}; check with `sky status` and tear it down "
                                "with `sky down` so that it does not keep costing money") from e


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its SkyPilot version knows (``detach_run`` and
    ``stream_logs`` went away with the client SDK)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


def _resources(sky: Any, cloud: str, region: str | None, instance_type: str, spot: bool) -> Any:
    """``sky.Resources`` for one instance type: ``infra="cloud/region"`` (SkyPilot 0.9+), or
    ``cloud=``/``region=`` for older versions."""
    try:
        return sky.Resources(infra=f"{cloud}/{region}" if region else cloud, instance_type=instance_type,
                             use_spot=spot)
    except TypeError:
        cloud_obj = sky.clouds.CLOUD_REGISTRY.from_str(cloud)
        return sky.Resources(cloud=cloud_obj, region=region, instance_type=instance_type, use_spot=spot)


def _check_of(e: BaseException) -> str:
    name = type(e).__name__.lower()
    text = str(e).lower()
    if "noclouds" in name or "credential" in text or "permission" in text or "not enabled" in text:
        return "permission"
    if "resourcesunavailable" in name or "capacity" in text or "quota" in text or "unavailable" in text:
        return "capacity"
    if "invalid" in name or "not supported" in text or "not available in" in text:
        return "catalog"
    return "launch"
