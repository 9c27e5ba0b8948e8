"""Watchdogs that end a training run which can no longer train, instead of letting it stall: AReaL 1.0.4
watches neither its inference servers (`ServerWatchdog`) nor its SLURM jobs (`Watchdog` over a probe). Before
a run (or an evaluation), `endpoint_problems` asks the OpenAI-compatible endpoints it needs if they answer.
`CONTROL` is how something outside the loop (`slurm/requeue.py`) asks the run to stop at a safe point."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from examples.tau2.runtime.process import hard_exit, stop_descendants

logger = logging.getLogger("tau2_areal.recover")


class InferenceServerDied(RuntimeError):
    """An inference server stopped accepting connections during training."""


class WorkerJobEnded(RuntimeError):
    """A SLURM job of the run's workers ended (cancelled, failed, node lost) during training."""


class StopRequested(RuntimeError):
    """The run stopped because it was asked to (`RunControl.stop_reason`): at a step's end after saving
    it, or wherever it was when the request's deadline passed."""


@dataclass
class RunControl:
    """Between the training loop and what watches it from outside: a request to stop at the next safe
    point, and where the loop is (AReaL's 0-based global steps)."""

    stop_reason: str = ""
    """Why the run was asked to stop ('' while it was not)."""
    resumed_from: int | None = None
    """The saved step this process resumed from (None: it started at step 1, or has not got that far)."""
    first_step: int | None = None
    """The first step this process committed, and when (`time.time()`)."""
    first_step_at: float | None = None
    last_step: int | None = None
    """The last step this process committed (its stats written)."""
    saved_step: int | None = None
    """The last step whose state is saved (set at resume and at each save); read it with `last_saved`."""
    committing: tuple[int, Path] | None = None
    """A save being committed: its step, and the record that makes it saved (a rerun completes it)."""
    finished: bool = False
    saving: bool = False
    """At a step's end, committing its stats and saving: a stop past its deadline waits for this."""
    on_first_step: Callable[[], None] | None = None

    def last_saved(self) -> int | None:
        """Exact whenever a signal comes: a save being committed counts once its record exists."""
        return self.committing[0] if self.committing and self.committing[1].exists() else self.saved_step

    def committed(self, step: int) -> None:
        first = self.first_step is None
        if first:
            self.first_step, self.first_step_at = step, time.time()
        self.last_step = step
        if first and self.on_first_step is not None:
            self.on_first_step()


CONTROL = RunControl()
"""This process's run (one training run per process)."""


def interrupt_main_thread() -> None:
    """SIGINT to the main thread: wakes it from a blocking wait (`_thread.interrupt_main` would not)."""
    ident = threading.main_thread().ident
    if ident is not None:
        signal.pthread_kill(ident, signal.SIGINT)


class Watchdog:
    """While active, calls `probe()` every `poll_s` (None: nothing to watch); the first time it returns a
    sentence (the run cannot go on), logs it and interrupts the main thread (`failure` says why). If the run
    is still inside the block `exit_after_s` later (a job started with `&` by a non-interactive shell
    ignores SIGINT, and a wait may swallow it), it stops every child process and exits with status 1:
    never a stalled run."""

    def __init__(self, probe: Callable[[], str] | None, poll_s: float = 5.0, exit_after_s: float = 60.0,
                 name: str = "tau2-watchdog"):
        self.probe, self.poll_s, self.exit_after_s = probe, poll_s, exit_after_s
        self.failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name=name)

    def __enter__(self) -> Watchdog:
        if self.probe is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                failure = self.probe()
            except Exception as e:  # a probe that cannot look (e.g. SLURM busy) is not a failure of the run
                logger.warning("%s could not check the run: %s: %s", self._thread.name, type(e).__name__, e)
                continue
            if not failure or self._stop.is_set():
                continue
            self.failure = failure
            logger.error("%s", failure)
            interrupt_main_thread()
            if not self._stop.wait(self.exit_after_s):
                logger.error("the run did not stop within %.0f s of the interrupt; exiting: %s",
                             self.exit_after_s, failure)
                stop_descendants()
                hard_exit(1)
            return


class ServerWatchdog(Watchdog):
    """A `Watchdog` that connects to each `(host, port)` every `poll_s` and fails once one has refused
    connections for `dead_after_s` (no addresses: it watches nothing)."""

    def __init__(self, addresses: list[tuple[str, int]], dead_after_s: float, poll_s: float = 5.0,
                 exit_after_s: float = 60.0):
        super().__init__(self._dead_server if addresses else None, poll_s, exit_after_s,
                         name="tau2-server-watchdog")
        self.addresses, self.dead_after_s = addresses, dead_after_s
        self._down_since: dict[tuple[str, int], float] = {}

    def _dead_server(self) -> str:
        for host, port in self.addresses:
            try:
                socket.create_connection((host, port), timeout=5.0).close()
            except OSError:
                since = self._down_since.setdefault((host, port), time.monotonic())
                if time.monotonic() - since >= self.dead_after_s:
                    return (f"the inference server at {host}:{port} has refused connections for "
                            f"{time.monotonic() - since:.0f} s (it died); rerun the same command to resume "
                            "from the last saved step")
            else:
                self._down_since.pop((host, port), None)
        return ""


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def endpoint_problems(what: str, url_setting: str, url: str, key_env: str, model_setting: str, model: str,
                      hint: str, timeout_s: float, scheduler: str | None = None) -> list[str]:
    """None or one sentence (ending in `hint` when unreachable): the endpoint answers `GET <url>/models` with
    the key in `$key_env`, serves `model` if it lists models, and is not on loopback under SLURM."""
    url = url.rstrip("/")
    if scheduler == "slurm" and (urllib.parse.urlparse(url).hostname or "") in LOOPBACK_HOSTS:
        return [f"{url_setting}={url} is a loopback address, which the rollout workers on other nodes cannot "
                f"reach; use the {what} host's name or IP"]
    key = os.environ.get(key_env) or "EMPTY"
    try:
        response = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
    except httpx.HTTPError as e:
        return [f"the {what} at {url_setting}={url} is not reachable ({type(e).__name__}); {hint}"]
    if response.status_code in (401, 403):
        return [f"the {what} at {url} rejects the key in ${key_env} (HTTP {response.status_code})"]
    if response.status_code == 200:
        try:
            served = [str(m["id"]) for m in response.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            served = []
        if served and model not in served:
            return [f"the {what} at {url} serves {', '.join(served)}, not {model_setting}={model}"]
    return []  # any other answer: up, without an OpenAI model list to compare against
