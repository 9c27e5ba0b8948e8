"""A throw-away CPU-only SLURM on this machine: try the cluster path before queueing for GPUs.

    python -m examples.tau2.slurm.local_cluster up [--nodes 2] [--dir DIR]   (= tau2_rl.sh slurm-local up)
    python -m examples.tau2.slurm.local_cluster status|down [--dir DIR]

Debian's `slurm-wlm` and `munge` (installed with apt-get when missing) run as root in the background, one
`slurmctld`, one `munged` and one `slurmd` per node, all on this host (`NodeAddr=127.0.0.1`, a port per
node). Everything lives under one folder: the config, munge's key and socket, the daemons' state, spool and
logs, and `daemons.json`, which records each daemon's pid and start time so that `down` stops exactly
those processes. Clients find the cluster through `SLURM_CONF=<dir>/slurm.conf` (`up` prints the line;
`tau2_rl.sh` exports it when this cluster is up). Nothing here needs a GPU: nodes declare CPUs and
memory only (`SlurmdParameters=config_overrides` lets them declare more CPUs than the machine has).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEBIAN_PACKAGES = ("slurm-wlm", "slurm-client", "munge")
DAEMON_BINARIES = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "squeue", "scancel",
                   "sinfo", "scontrol")
DEFAULT_DIR = Path(__file__).resolve().parents[3] / ".tau2-run" / "slurm"
STATE_FILE = "daemons.json"
CONF_FILE = "slurm.conf"
MAX_SOCKET_PATH = 107  # sockaddr_un's sun_path holds 108 bytes with the terminating NUL
UP_TIMEOUT_S = 30.0
INSTALL_LOCK = "/tmp/tau2-slurm-install.lock"
REQUEUE_WAIT_S = 10
"""How long a requeued job waits before it may start again (`cred_expire`; SLURM's default is 120 s)."""


class LocalClusterError(RuntimeError):
    """The local cluster cannot be brought up, or is not what the caller expects; one sentence."""


@dataclass(frozen=True)
class Daemon:
    """One background process of the cluster: `pid` and its start time name it for good."""

    name: str
    pid: int
    started: float
    log: str

    def running(self) -> bool:
        import psutil

        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.started) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


@dataclass
class ClusterSpec:
    """What `up` builds: `nodes` nodes named n1..nN, each with `cpus` CPUs and `mem_mb` MiB."""

    nodes: int = 1
    cpus: int = 4
    mem_mb: int = 20480
    """Room for the smoke run's jobs at once (trainer and vLLM server 8 GiB each, its controller's 2 GiB);
    SLURM counts it but does not enforce it here, so a smaller machine may declare it too."""
    partition: str = "cpu"
    node_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise LocalClusterError(f"--nodes must be at least 1, got {self.nodes}")
        if self.cpus < 1 or self.mem_mb < 256:
            raise LocalClusterError(f"nodes need at least 1 CPU and 256 MiB (got {self.cpus}, {self.mem_mb})")
        self.node_names = [f"n{i + 1}" for i in range(self.nodes)]


@dataclass
class LocalCluster:
    """A cluster brought up under `root`; `conf` is what clients need as `SLURM_CONF`."""

    root: Path
    spec: ClusterSpec
    daemons: list[Daemon]

    @property
    def conf(self) -> Path:
        return self.root / CONF_FILE

    def env(self) -> dict[str, str]:
        """This process's environment with the cluster's `SLURM_CONF`."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, timeout_s: float = 30.0) -> str:
        """A SLURM client command against this cluster; its stdout (raises on failure)."""
        done = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise LocalClusterError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def jobs(self) -> list[str]:
        """Every job the controller still knows (any state): `id state name` lines."""
        return [line for line in self.run("squeue", "-h", "-t", "all", "-o", "%i %T %j").splitlines() if line]

    def active_jobs(self) -> list[str]:
        """Jobs pending, running or completing."""
        return [line for line in self.run("squeue", "-h", "-o", "%i %T %j").splitlines() if line]


# ---------------------------------------------------------------------------------------------
# Set-up


def missing_binaries() -> list[str]:
    return [b for b in DAEMON_BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def ensure_installed() -> None:
    """Install Debian's SLURM and munge packages when any of their programs is missing (needs root). One
    process at a time (a file lock): two test workers must not run apt-get at once."""
    if not missing_binaries():
        return
    import fcntl

    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if missing_binaries():
            _install()


def _install() -> None:
    if os.geteuid() != 0:
        raise LocalClusterError(f"SLURM is not installed ({', '.join(missing_binaries())} missing) and "
                                "installing it needs root: run as root, or `apt-get install "
                                f"{' '.join(DEBIAN_PACKAGES)}` first")
    if shutil.which("apt-get") is None:
        raise LocalClusterError("SLURM is not installed and this machine has no apt-get: install "
                                f"{', '.join(DEBIAN_PACKAGES)} with its package manager")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=120"]  # another apt-get (not ours) may hold dpkg's lock
    for cmd in (["apt-get", *wait, "update", "-qq"],
                ["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise LocalClusterError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-500:]}")
    if missing_binaries():
        raise LocalClusterError(f"installed {', '.join(DEBIAN_PACKAGES)} but {', '.join(missing_binaries())} "
                                "are still missing")


def sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports the OS reports free right now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def slurm_conf(root: Path, spec: ClusterSpec, ctld_port: int, node_ports: list[int],
               munge_socket: Path) -> str:
    host = socket.gethostname().split(".")[0]
    lines = [
        "# A throw-away CPU-only cluster (examples/tau2/slurm/local_cluster.py), all under this folder.",
        "ClusterName=tau2local",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: also how long a requeued job waits before it may start again (SLURM's default 120 s)
        f"AuthInfo=socket={munge_socket},cred_expire={REQUEUE_WAIT_S}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'spool'}/%n/slurmd.pid",
        f"SlurmctldLogFile={root / 'logs' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'logs'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SlurmdParameters=config_overrides",
        "EnforcePartLimits=ALL",  # a job larger than any node is refused at sbatch, not PENDING forever
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=30",  # SLURM's default: the time a SIGTERM-ed job has to clean up
        "MinJobAge=300",  # finished jobs stay visible to squeue/scontrol for 5 minutes
        "SchedulerParameters=sched_interval=5",  # a requeued job starts within seconds of its wait
    ]
    for name, port in zip(spec.node_names, node_ports, strict=True):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={spec.cpus} RealMemory={spec.mem_mb} State=UNKNOWN")
    lines.append(f"PartitionName={spec.partition} Nodes={','.join(spec.node_names)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start(name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Daemon:
    """Start a daemon in the foreground of its own session (a test's process group dying spares it)."""
    import psutil

    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    return Daemon(name, proc.pid, psutil.Process(proc.pid).create_time(), str(log))


def _wait(what: str, predicate, daemons: list[Daemon], timeout_s: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        dead = [d for d in daemons if not d.running()]
        if dead:
            log = Path(dead[0].log)
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            raise LocalClusterError(f"{dead[0].name} exited while waiting for {what}; its log "
                                    f"({dead[0].log}) ends:\n{tail}")
        if time.monotonic() > deadline:
            raise LocalClusterError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.2)


def up(root: Path = DEFAULT_DIR, spec: ClusterSpec | None = None) -> LocalCluster:
    """Bring up a fresh cluster under `root` (a cluster already up there is stopped first)."""
    spec = spec or ClusterSpec()
    if os.geteuid() != 0:
        raise LocalClusterError("the local SLURM runs its daemons as root (slurmd starts jobs as their "
                                "user); run this as root")
    ensure_installed()
    root = root.absolute()
    down(root)
    munge_dir = root / "munge"
    socket_path = munge_dir / "munge.sock"
    if len(str(socket_path)) > MAX_SOCKET_PATH:
        raise LocalClusterError(f"munge's socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes; "
                                "choose a shorter --dir")
    shutil.rmtree(root, ignore_errors=True)
    for d in (munge_dir, root / "state", root / "logs", *(root / "spool" / n for n in spec.node_names)):
        d.mkdir(parents=True, exist_ok=True)
    munge_dir.chmod(0o755)  # munged refuses a socket folder others cannot traverse ("inaccessible")
    key = munge_dir / "munge.key"
    subprocess.run([sbin("mungekey"), "-c", "-k", str(key), "-b", "1024"], check=True, capture_output=True)
    key.chmod(0o600)
    ctld_port, *node_ports = free_ports(1 + spec.nodes)
    (root / CONF_FILE).write_text(slurm_conf(root, spec, ctld_port, node_ports, socket_path))
    logs = root / "logs"
    daemons: list[Daemon] = []
    try:
        daemons.append(_start("munged", [sbin("munged"), "-F", "--force", f"--key-file={key}",
                                         f"--socket={socket_path}", f"--pid-file={munge_dir / 'munged.pid'}",
                                         f"--log-file={logs / 'munged.log'}",
                                         f"--seed-file={munge_dir / 'munge.seed'}"], logs / "munged.out"))
        _wait("munge's socket", socket_path.exists, daemons)
        conf = str(root / CONF_FILE)
        env = {**os.environ, "SLURM_CONF": conf}
        daemons.append(_start("slurmctld", [sbin("slurmctld"), "-D", "-i", "-f", conf],
                              logs / "slurmctld.out", env))
        for name in spec.node_names:
            daemons.append(_start(f"slurmd {name}", [sbin("slurmd"), "-D", "-N", name, "-f", conf],
                                  logs / f"slurmd-{name}.out", env))
        cluster = LocalCluster(root, spec, daemons)
        _write_state(cluster)

        def idle() -> bool:
            try:
                states = cluster.node_states()
            except (LocalClusterError, subprocess.TimeoutExpired):
                return False
            return len(states) == spec.nodes and all(s.rstrip("*") == "idle" for s in states.values())

        _wait(f"{spec.nodes} idle node(s)", idle, daemons)
    except BaseException:
        _stop(daemons)
        (root / STATE_FILE).unlink(missing_ok=True)
        raise
    return cluster


def _write_state(cluster: LocalCluster) -> None:
    state = {"spec": {"nodes": cluster.spec.nodes, "cpus": cluster.spec.cpus, "mem_mb": cluster.spec.mem_mb,
                      "partition": cluster.spec.partition},
             "daemons": [asdict(d) for d in cluster.daemons]}
    (cluster.root / STATE_FILE).write_text(json.dumps(state, indent=2))


def load(root: Path = DEFAULT_DIR) -> LocalCluster | None:
    """The cluster recorded under `root`, or None when none was brought up there."""
    path = root.absolute() / STATE_FILE
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    daemons = [Daemon(**d) for d in state["daemons"]]
    return LocalCluster(root.absolute(), ClusterSpec(**state["spec"]), daemons)


def job_steps(conf: Path) -> list[Any]:
    """The job steps (`slurmstepd` and what it runs) of the cluster whose config is `conf`. A step leaves
    slurmd's process tree at once (slurmstepd is re-parented to init), so it is found by the SLURM_CONF
    that slurmd handed it."""
    import psutil

    wanted = f"SLURM_CONF={conf}".encode()
    steps = []
    for p in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error, OSError):
            # Read raw: slurmstepd retitles itself over the start of its environment block, which ends
            # psutil's `environ()` at the first empty entry.
            if p.info["name"] != "slurmstepd":
                continue
            if wanted in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0"):
                steps += [*p.children(recursive=True), p]
    return steps


def _stop(daemons: list[Daemon], timeout_s: float = 10.0, steps: list[Any] | None = None) -> list[Daemon]:
    """SIGTERM each running daemon (slurmd first, munged last), SIGKILL what is left of them, of their
    descendants and of `steps` (slurmstepd ignores SIGTERM); the daemons signalled."""
    import psutil

    order = sorted(daemons, key=lambda d: {"munged": 2, "slurmctld": 1}.get(d.name, 0))
    alive = [d for d in order if d.running()]
    procs = list(steps or [])
    for d in alive:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(d.pid)
            # slurmd's job steps (slurmstepd and the tasks) are its descendants only while it lives
            procs += [*p.children(recursive=True), p]
            os.kill(d.pid, signal.SIGTERM)
    _, left = psutil.wait_procs(procs, timeout=timeout_s)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=timeout_s)
    return alive


def down(root: Path = DEFAULT_DIR) -> list[Daemon]:
    """Stop the daemons recorded under `root` (only those: pid and start time must match); the stopped."""
    cluster = load(root)
    if cluster is None:
        return []
    with contextlib.suppress(LocalClusterError, subprocess.TimeoutExpired, OSError):
        if all(d.running() for d in cluster.daemons):  # let slurmd end the job steps it runs
            cluster.run("scancel", "--full", "--state=RUNNING", timeout_s=5)
            cluster.run("scancel", "--state=PENDING", timeout_s=5)
    stopped = _stop(cluster.daemons, steps=job_steps(cluster.conf))
    (cluster.root / STATE_FILE).unlink(missing_ok=True)
    return stopped


@contextlib.contextmanager
def running(root: Path, spec: ClusterSpec | None = None) -> Iterator[LocalCluster]:
    """A cluster for the duration of a block (tests): up on entry, down on exit."""
    cluster = up(root, spec)
    try:
        yield cluster
    finally:
        down(root)


def status(root: Path = DEFAULT_DIR) -> str:
    cluster = load(root)
    if cluster is None:
        return f"no local SLURM under {root}"
    lines = [f"local SLURM under {cluster.root} ({cluster.spec.nodes} node(s), {cluster.spec.cpus} CPUs and "
             f"{cluster.spec.mem_mb} MiB each)", f"export SLURM_CONF={cluster.conf}"]
    for d in cluster.daemons:
        lines.append(f"  {d.name:<12} pid {d.pid:<8} {'running' if d.running() else 'NOT RUNNING'}")
    if all(d.running() for d in cluster.daemons):
        with contextlib.suppress(LocalClusterError, subprocess.TimeoutExpired):
            lines += [f"  node {n}: {s}" for n, s in cluster.node_states().items()]
            lines += [f"  job {j}" for j in cluster.jobs()]
    return "\n".join(lines)


def _already_up(cluster: LocalCluster, wanted: ClusterSpec) -> int:
    """`up` where a cluster runs: left as it is, its jobs included (0), or refused when another shape was
    asked for (1)."""
    shape = f"{cluster.spec.nodes} node(s) of {cluster.spec.cpus} CPUs and {cluster.spec.mem_mb} MiB"
    if cluster.spec != wanted:
        print(f"slurm-local: a local SLURM of {shape} already runs under {cluster.root}; left as it is (its "
              "jobs too): `tau2_rl.sh slurm-local down` first to bring up another", file=sys.stderr)
        return 1
    print(f"local SLURM already up under {cluster.root} ({shape}); left as it is, its jobs too",
          file=sys.stderr)
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.tau2.slurm.local_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down", "status", "install"),
                        help="install: only Debian's packages, when missing (what up does first)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state folder (default {DEFAULT_DIR})")
    parser.add_argument("--nodes", type=int, default=1, help="up: number of nodes (default 1)")
    parser.add_argument("--cpus", type=int, default=4, help="up: CPUs each node declares (default 4)")
    parser.add_argument("--mem-mb", type=int, default=ClusterSpec.mem_mb,
                        help=f"up: memory each node declares, MiB (default {ClusterSpec.mem_mb})")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            spec = ClusterSpec(nodes=args.nodes, cpus=args.cpus, mem_mb=args.mem_mb)
            current = load(args.dir)
            if current is not None and all(d.running() for d in current.daemons):
                return _already_up(current, spec)
            start = time.monotonic()
            cluster = up(args.dir, spec)
            print(f"local SLURM up in {time.monotonic() - start:.1f} s: {args.nodes} node(s) "
                  f"({', '.join(cluster.spec.node_names)}); stop it with `tau2_rl.sh slurm-local down`",
                  file=sys.stderr)
            print(f"export SLURM_CONF={cluster.conf}")
        elif args.action == "down":
            stopped = down(args.dir)
            print(f"local SLURM down: stopped {len(stopped)} daemon(s)" if stopped else
                  f"no local SLURM running under {args.dir}", file=sys.stderr)
        elif args.action == "install":
            ensure_installed()
            print("slurm-local: SLURM and munge are installed", file=sys.stderr)
        else:
            print(status(args.dir))
    except LocalClusterError as e:
        print(f"slurm-local: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
