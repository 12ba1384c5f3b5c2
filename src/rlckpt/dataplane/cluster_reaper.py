"""The private Ray cluster dies with the process that started it: a watchdog run beside the driver.

Ray ties the GCS and the raylet to the driver (``PR_SET_PDEATHSIG``) and ``ray.shutdown`` stops what
it started, but the raylet's own children (DashboardAgent, RuntimeEnvAgent, idle workers) outlive a
driver that is SIGKILLed, and they rename themselves (``ray::DashboardAgent``), so their command line
no longer names the cluster. What they keep is their environment: the driver sets ``CLUSTER_ENV`` to
the cluster's temp dir before ``ray.init``, and every process of the cluster inherits it.

The driver starts this file as a script, by path (stdlib only: it runs in milliseconds, without
importing rlckpt's packages), in a session of its own, holding the write end of a pipe whose read end
is the reaper's stdin. End of file on it — the driver closed it in ``stop_local_ray``, exited, or was
killed — is the one signal the reaper acts on: it SIGKILLs every process of the cluster until none is
left, removes the temp dir if asked, and exits. It ignores SIGTERM, SIGINT and SIGHUP: a job-wide
SIGTERM (Slurm) is the driver's to handle, and the reaper must outlive the driver's stop.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

CLUSTER_ENV = "RLCKPT_RAY_CLUSTER"  # every process of a private cluster: its temp dir
REAP_TIMEOUT_S = 10.0  # how long the reaper keeps killing what a dying cluster may still spawn
REAPER_WAIT_S = REAP_TIMEOUT_S + 5.0  # how long the driver waits for the reaper once it asked it to reap
_POLL_S = 0.05
IGNORED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}  # the driver's to handle, not the reaper's


class ClusterReaper:
    """The driver's handle on the reaper of its cluster in ``temp_dir``, started before ``ray.init``: it
    kills the cluster's processes once the driver calls ``reap``, exits or dies."""

    def __init__(self, temp_dir: str | Path, *, remove_dir: bool) -> None:
        command = [sys.executable, "-I", "-S", __file__, str(temp_dir), "--driver", str(os.getpid())]
        # born with the signals it ignores blocked (the mask is inherited): one sent before it has set them
        # to SIG_IGN stays pending, and is dropped then
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED)
        try:
            self.process = subprocess.Popen(
                command + (["--remove-dir"] if remove_dir else []),
                stdin=subprocess.PIPE,  # its write end is this process's alone (not inherited: O_CLOEXEC)
                start_new_session=True,  # a Ctrl-C or a kill of the driver's process group does not reach it
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def reap(self) -> None:
        """Kill what is left of the cluster now, and wait (at most REAPER_WAIT_S) until it is done."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=REAPER_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the reaper of the Ray cluster did not finish within %.0fs", REAPER_WAIT_S)


def cluster_processes(temp_dir: str, *, exclude: Iterable[int] = ()) -> list[int]:
    """Pids of the live processes of the cluster in ``temp_dir``: ``CLUSTER_ENV`` in their environment,
    or the dir on their command line (as a whole path: ``/tmp/x`` does not name ``/tmp/xy``). Processes of
    other users (whose environment cannot be read) and zombies (which have none) are not listed."""
    marker = f"{CLUSTER_ENV}={temp_dir}".encode()
    on_command_line = re.compile(re.escape(temp_dir.encode()) + rb"(?=/|\x00|$)")
    skip = {os.getpid(), *exclude}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env, open(f"/proc/{entry}/cmdline", "rb") as cmd:
                environ, cmdline = env.read(), cmd.read()
        except OSError:  # gone meanwhile, or not ours
            continue
        if marker in environ.split(b"\x00") or on_command_line.search(cmdline):
            found.append(int(entry))
    return found


def reap(temp_dir: str, *, exclude: Iterable[int] = (), timeout_s: float = REAP_TIMEOUT_S) -> list[int]:
    """SIGKILL every process of the cluster in ``temp_dir`` until none is left (or ``timeout_s``);
    the pids it killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while pids := cluster_processes(temp_dir, exclude=exclude):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    return killed


def main(argv: list[str] | None = None) -> int:
    """``cluster_reaper.py TEMP_DIR --driver PID [--remove-dir]``: wait for end of file on stdin, then reap."""
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="cluster_reaper")
    parser.add_argument("temp_dir")
    parser.add_argument("--driver", type=int, required=True, help="the driver's pid, never killed")
    parser.add_argument("--remove-dir", action="store_true", help="remove TEMP_DIR once the cluster is gone")
    args = parser.parse_args(argv)
    while sys.stdin.buffer.read(4096):  # the driver never writes: this returns b"" when it closed or died
        pass
    reap(args.temp_dir, exclude=[args.driver])
    if args.remove_dir:
        shutil.rmtree(args.temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
