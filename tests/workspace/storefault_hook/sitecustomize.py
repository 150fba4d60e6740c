"""Fault injection at the OS write boundary of the local repository backend, for the store
fault campaign (tests/workspace/test_store_campaign.py). This machine has no device-mapper
(no dm-error / dm-flakey), so a failing or slow disk is made here, in every Python process of
a trial: ``os.fsync`` of a file under ``$SOJOURN_STOREFAULT_REPO`` raises EIO while the file
``$SOJOURN_STOREFAULT_DIR/eio`` exists, and takes 0.25 s more while ``.../slow`` exists. The
backend fsyncs every object it writes before renaming it into place, so every repository
write goes through here; nothing else (the program, caches) is touched."""

import errno
import os
import time

_dir = os.environ.get("SOJOURN_STOREFAULT_DIR")
_repo = os.environ.get("SOJOURN_STOREFAULT_REPO")
if _dir and _repo:
    _real_fsync = os.fsync

    def _fsync(fd: int) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) else ""
        except OSError:
            target = ""
        if target.startswith(_repo):
            if os.path.exists(os.path.join(_dir, "eio")):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            if os.path.exists(os.path.join(_dir, "slow")):
                time.sleep(0.25)
        _real_fsync(fd)

    os.fsync = _fsync
