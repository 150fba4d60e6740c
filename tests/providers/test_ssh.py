"""The ssh provider against a REAL sshd on 127.0.0.1 (OpenSSH, started here with its own
host key and an authorized key for the current user, on a free port; stopped at the end).

Besides the conformance suite: a `sojourn run` started over ssh, paused by terminate (its
supervisor forwards the SIGTERM), resumed locally to the same output; the coreutils-timeout
hard stop; refusals naming the failed check.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sojourn.providers.base import LaunchFailed, LaunchSpec, Offer, Requirements, get_provider
from sojourn.providers.ssh import BACKSTOP_MARGIN_S, SshProvider
from tests.providers.conformance import ProviderConformance, wait_status
from tests.workspace.conftest import Shell, finish, wait_for

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unavailable(why: str) -> None:
    if os.environ.get("SOJOURN_REQUIRE_SSHD"):
        pytest.fail(f"SOJOURN_REQUIRE_SSHD is set but sshd cannot run here: {why}", pytrace=False)
    pytest.skip(f"no sshd: {why}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not os.path.exists(SSHD):
        if os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "openssh-server"], capture_output=True, timeout=600,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if not os.path.exists(SSHD):
            _unavailable("openssh-server is not installed (apt-get install openssh-server)")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        _unavailable("the ssh client is not installed (apt-get install openssh-client)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
        "MaxStartups 100", "MaxSessions 100", "LogLevel ERROR", ""]))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                _unavailable(f"sshd exited ({proc.returncode}): {proc.stderr.read().decode() if proc.stderr else ''}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        host = {"host": "127.0.0.1", "port": port, "key": str(d / "id_ed25519"), "user": _user(),
                "python": sys.executable, "workdir": str(d / "work"), "cpus": 1, "memory": "1GiB",
                "options": [f"UserKnownHostsFile={d / 'known_hosts'}", "StrictHostKeyChecking=accept-new"]}
        yield {"port": port, "dir": d, "host": host}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def ssh(sshd: dict[str, Any], tmp_path: Path) -> Iterator[SshProvider]:
    p = SshProvider(None, hosts={"lo": dict(sshd["host"]), "big": {**sshd["host"], "cpus": 64, "memory": "1TiB",
                                                                   "price_per_hour": 2.5}})
    p.terminate_grace = 5.0
    yield p
    p.close()


class TestSshConformance(ProviderConformance):
    @pytest.fixture
    def provider(self, ssh: SshProvider) -> SshProvider:
        return ssh

    @pytest.fixture
    def launchable(self, provider: SshProvider) -> Offer:
        return provider.offer_of("lo")


def test_provider_is_registered_and_reads_the_machines_config(tmp_path: Path) -> None:
    from sojourn.repository.repo import open_repository

    r = open_repository(tmp_path / "repo", create=True)
    try:
        from sojourn.providers.machines import sign_machines

        r.backend.save("config", "machines.toml", b'[ssh.gpu1]\nhost = "gpu1.lab"\ngpus = 4\ngpu = "A100"\n'
                                                  b'price_per_hour = 0.5\n')
        # A hand-written config names hosts (and what runs there): used once the owner signed it.
        with pytest.raises(Exception, match=r"\[ssh\] is in a config not signed with the repository key"):
            get_provider("ssh", r)
        sign_machines(r)
        p = get_provider("ssh", r)
        assert isinstance(p, SshProvider)
        [o] = p.offers(Requirements(gpus=2, gpu="a100"))
        assert o.name == "gpu1" and o.provider == "ssh" and o.price == 0.5
        r.backend.save("config", "machines.toml", b'[ssh.x]\nhost = "h"\nbogus = 1\n')
        sign_machines(r)
        with pytest.raises(Exception, match=r"unknown key.*bogus"):
            get_provider("ssh", r)
    finally:
        r.close()


def test_offers_and_probe(ssh: SshProvider) -> None:
    assert [o.name for o in ssh.offers(Requirements())] == ["lo", "big"]  # cheapest first
    assert [o.name for o in ssh.offers(Requirements(memory=8 << 30))] == ["big"]
    info = ssh.probe("lo")
    assert info["arch"] == os.uname().machine and info["cpus"] and info["python_version"] == "{}.{}.{}".format(*sys.version_info[:3])


def test_refusals_name_the_check(ssh: SshProvider, sshd: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(LaunchFailed) as e:
        ssh.launch(Offer("ssh", "nope"), LaunchSpec("ws_x", "al_1", ["true"]))
    assert e.value.check == "catalog"
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    denied = SshProvider(None, hosts={"lo": {**sshd["host"], "key": str(other_key)}})
    with pytest.raises(LaunchFailed) as e:
        denied.launch(denied.offer_of("lo"), LaunchSpec("ws_x", "al_2", ["true"]))
    assert e.value.check == "permission", str(e.value)
    down = SshProvider(None, hosts={"lo": {**sshd["host"], "port": _free_port()}})
    with pytest.raises(LaunchFailed) as e:
        down.launch(down.offer_of("lo"), LaunchSpec("ws_x", "al_3", ["true"]))
    assert e.value.check == "capacity"
    assert down.status(_fake_handle()) == "unknown"  # unreachable is not "ended"
    denied.close()
    down.close()


def _fake_handle() -> Any:
    from sojourn.providers.base import Handle

    return Handle("ssh", "lo", "al_x", {"pid": 1, "pid_start": "1"})


def test_hard_stop_without_a_provider_limit_is_a_timeout_watchdog(ssh: SshProvider) -> None:
    """A command that is not sojourn's supervisor still ends: `timeout` ends it after the hard
    stop plus the session's grace (here 1 s) plus the margin."""
    t0 = time.monotonic()
    h = ssh.launch(ssh.offer_of("lo"), LaunchSpec("ws_t", "al_hard", ["sleep", "600"], hard_stop=1,
                                                  env={"SOJOURN_HARD_STOP_GRACE": "1"}))
    try:
        assert wait_status(ssh, h, {"ended"}, 30) == "ended"
        assert time.monotonic() - t0 >= 1 + 1 + BACKSTOP_MARGIN_S - 1  # not before sojourn's own watchdog
    finally:
        ssh.terminate(h)


SLOW = """
import time
for i in range(600):
    print(i, flush=True)
    time.sleep(0.1)
"""


def test_a_hard_stop_over_ssh_is_recorded_as_a_hard_stop(ssh: SshProvider, tmp_path: Path) -> None:
    """sojourn's watchdog fires first: the session pauses and the allocation says hard-stop
    (before, `timeout`'s SIGTERM came at the same moment and it said suspended)."""
    sh = Shell(tmp_path)
    try:
        sh.write("slow.py", SLOW, prelude=False)
        env = {k: sh.env[k] for k in ("PYTHONPATH", "SOJOURN_CACHE", "SOJOURN_REPO", "SOJOURN_HOME") if k in sh.env}
        env["SOJOURN_HARD_STOP_GRACE"] = "20"
        h = ssh.launch(ssh.offer_of("lo"), LaunchSpec(
            "ws_new", "al_hard", [sys.executable, "-m", "sojourn.cli.main", "run", "--repo", sh.repo,
                                  "--max-duration", "3s", "slow.py"], env=env, cwd=str(sh.dir), hard_stop=3))
        assert wait_status(ssh, h, {"ended"}, 60) == "ended"
        import json

        ws = json.loads(sh.cli("ps", "--json").stdout)[0]["id"]
        rec = sh.show(ws)
        assert rec["state"] == "suspended" and rec["stop_reason"] == "hard-stop", rec
        assert rec["allocations"][0]["stop_reason"] == "hard-stop" and rec["last_capsule"]["verified"]
    finally:
        sh.kill_all()


COUNT = """
import time
for i in range(60):
    print(i, flush=True)
    time.sleep(0.1)
print("done")
"""


def test_sojourn_run_over_ssh_then_resume_locally(ssh: SshProvider, tmp_path: Path) -> None:
    sh = Shell(tmp_path)
    try:
        sh.write("count.py", COUNT, prelude=False)
        expected = sh.plain("count.py")
        env = {k: sh.env[k] for k in ("PYTHONPATH", "SOJOURN_CACHE", "SOJOURN_REPO", "SOJOURN_HOME") if k in sh.env}
        h = ssh.launch(ssh.offer_of("lo"), LaunchSpec("ws_new", "al_ssh", [sys.executable, "-m", "sojourn.cli.main",
                                                                           "run", "--repo", sh.repo, "count.py"],
                                                      env=env, cwd=str(sh.dir)))

        def lines() -> int:
            p = sh.cli("ps", "--json")
            if p.returncode != 0 or p.stdout.strip() in ("", "[]"):
                return 0
            import json

            ws = json.loads(p.stdout)[0]["id"]
            return len(sh.cli("logs", ws, "--stream", "stdout").stdout.splitlines())

        wait_for(lambda: lines() >= 5, 60, "the run over ssh to print")
        ssh.terminate(h)  # SIGTERM to the group: the supervisor forwards it, the session pauses
        assert ssh.status(h) == "ended"
        import json

        ws = json.loads(sh.cli("ps", "--json").stdout)[0]["id"]
        rec = sh.show(ws)
        assert rec["state"] == "suspended" and rec["last_capsule"]["verified"], rec["detail"]
        code, _out, err = finish(sh.start("resume", ws))
        assert code == 0, err
        assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected
    finally:
        sh.kill_all()
