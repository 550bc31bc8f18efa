"""A Spark standalone cluster on this machine: one master and N workers from the pip-installed PySpark.

For tests and for trying the ``materializer spark`` commands on a real cluster (executors in their
own JVMs, Python workers started by them, not by the driver) without installing Spark::

    with LocalSparkCluster(tmp / "spark", workers=2) as cluster:
        cluster.master_url        # "spark://127.0.0.1:41234": give it to spark_session() or --master
        cluster.status()          # the master's JSON: aliveworkers, activeapps, completedapps, ...

    python -m materializer.spark.standalone --workers 2     # runs one until Ctrl-C, prints the URL

Each daemon is ``$SPARK_HOME/bin/spark-class`` (``SPARK_HOME`` = the installed ``pyspark``
package, which ships ``bin/`` and ``jars/``), exactly what Spark's ``sbin/start-master.sh`` and
``start-worker.sh`` run, minus their pid files and ``nohup``:

* master: ``spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W``;
  ready when its web UI's ``/json/`` says ``"status": "ALIVE"``;
* worker ``i``: ``spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P --host 127.0.0.1
  --port Q --cores C --memory M --work-dir <state_dir>/worker-<i>/work``; ready when the master's
  JSON lists it (``host:Q``) as ``ALIVE``. Workers start in parallel once the master answers.

Layout (everything the daemons write stays under ``state_dir``)::

    <state_dir>/master/master.out        the master's stdout and stderr (Spark logs INFO there)
    <state_dir>/master/master.json       {pid, url, web_ui_url, ...} while it runs (JvmService)
    <state_dir>/master/spark.conf        its --properties-file
    <state_dir>/worker-<i>/worker.out, worker.json, spark.conf
    <state_dir>/worker-<i>/work/<app id>/<executor id>/   an application's executor folders (stdout, stderr)

Processes: every daemon leads its own process group, and the executor JVMs a worker launches (and
their Python workers) stay in that group, so :meth:`LocalSparkCluster.stop` (SIGTERM to each group,
SIGKILL after the timeout) leaves nothing behind; the daemons also get SIGTERM when the Python
process that started them dies (Linux ``PR_SET_PDEATHSIG``, as
:class:`~materializer.local.kafka_broker.LocalKafkaBroker`), and a worker's shutdown hook kills its
executors. Lifecycle per daemon: :class:`~materializer.local.jvm_service.JvmService`.

Follows Spark's ``org.apache.spark.deploy.master.Master`` / ``deploy.worker.Worker`` command lines
(``MasterArguments``, ``WorkerArguments``); Spark's standalone mode is documented in
``docs/spark-standalone.md`` of Apache Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Self, Sequence

from materializer.adapters.errors import SparkClusterProvisioningError
from materializer.local.jvm_service import JvmService, find_java
from materializer.local.ports import free_port

__all__ = ["MASTER_CLASS", "WORKER_CLASS", "DAEMON_JAVA_OPTIONS", "LocalSparkCluster", "SparkMaster", "SparkWorker",
           "pyspark_home"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: ``SPARK_DAEMON_JAVA_OPTS`` of the master and workers: they schedule, they compute nothing, so
#: C1 only and the serial collector (quicker start on a busy machine). Executors are not affected.
DAEMON_JAVA_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: ``SPARK_DAEMON_MEMORY`` (heap of the master and of each worker daemon, not of executors).
DAEMON_MEMORY = "512m"
_BIND_ATTEMPTS = 3  # starts on new ports when a picked port was taken before the daemon bound it


def pyspark_home() -> Path:
    """The installed ``pyspark`` package folder, which is a Spark home (``bin/spark-class``, ``jars/``).

    Raises:
        SparkClusterProvisioningError: pyspark is not installed, or its package has no ``bin/spark-class``.
    """
    try:
        import pyspark
    except ImportError as exc:
        raise SparkClusterProvisioningError("pyspark is not installed (pip install 'kafka-materializer[spark]')") \
            from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise SparkClusterProvisioningError(f"{home} has no bin/spark-class: not a pip-installed PySpark")
    return home


def _http_json(url: str, timeout_s: float) -> dict[str, Any] | None:
    """The JSON document at ``url``, or None when it does not answer (in ``timeout_s`` seconds) or is not JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            document = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


class _SparkDaemon(JvmService):
    """A master or worker JVM launched through ``spark-class`` (see the module docstring)."""

    provisioning_error = SparkClusterProvisioningError
    status_probe_s = 2.0
    main_class: str

    def __init__(self, state_dir: Path | str, *, host: str = "127.0.0.1",
                 java_options: Sequence[str] = DAEMON_JAVA_OPTIONS, memory: str = DAEMON_MEMORY) -> None:
        super().__init__(state_dir, host=host)
        self.java_options = tuple(java_options)
        self.memory = memory

    @property
    def properties_file(self) -> Path:
        """The daemon's ``--properties-file`` (its path on the command line tells this daemon's JVM from others)."""
        return self.state_dir / "spark.conf"

    def _launch(self, arguments: Sequence[str], detach: bool) -> None:
        """Write the properties file and launch ``spark-class <main class> <arguments>`` (no wait)."""
        home = pyspark_home()
        find_java(what="a Spark standalone cluster", error=SparkClusterProvisioningError)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # A taken port fails the start (no silent move to port + 1, which the URL would not follow).
        self.properties_file.write_text("spark.port.maxRetries 0\n")
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_DAEMON_MEMORY": self.memory,
               "SPARK_DAEMON_JAVA_OPTS": " ".join(self.java_options), "SPARK_LOCAL_IP": self.host,
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        cmd = [str(home / "bin" / "spark-class"), self.main_class, *arguments, *self._identity_args()]
        self._launch_jvm(cmd, cwd=self.state_dir, detach=detach, env=env)

    def _start_retrying(self, pick_ports: Callable[[], bool], arguments: Callable[[], Sequence[str]],
                        timeout_s: float, detach: bool) -> Self:
        """Launch and wait (``timeout_s`` seconds per attempt); when the JVM failed because a picked
        port was taken meanwhile and ``pick_ports`` returns True (new ones picked), try again (3 attempts)."""
        for attempt in range(_BIND_ATTEMPTS):
            retry_possible = pick_ports()
            self._launch(arguments(), detach)
            try:
                self._await_jvm(timeout_s)
                return self
            except SparkClusterProvisioningError:
                if not retry_possible or attempt == _BIND_ATTEMPTS - 1 or not self.port_was_taken():
                    raise
        raise AssertionError("unreachable")

    def _identity_args(self) -> tuple[str, ...]:
        return ("--properties-file", str(self.properties_file))

    def port_was_taken(self) -> bool:
        """Whether the last launch failed because a port it was given was in use (BindException)."""
        output = self._output_since_launch()
        return "Address already in use" in output or "BindException" in output


class SparkMaster(_SparkDaemon):
    """The standalone master (``org.apache.spark.deploy.master.Master``) on ``host``.

    Args:
        state_dir: folder for ``master.out``, ``master.json`` and ``spark.conf``; created if missing.
        port / web_ui_port: the master's RPC port (the ``spark://`` URL) and its web UI; 0 picks free ones.

    :attr:`url` is the ``spark://host:port`` master URL; :meth:`status` the web UI's ``/json/``.
    """

    service_name = "Spark master"
    state_file = "master.json"
    address_key = "url"
    output_files = (("master.out", 40),)
    main_class = MASTER_CLASS

    def __init__(self, state_dir: Path | str, *, host: str = "127.0.0.1", port: int = 0, web_ui_port: int = 0,
                 java_options: Sequence[str] = DAEMON_JAVA_OPTIONS, memory: str = DAEMON_MEMORY) -> None:
        super().__init__(state_dir, host=host, java_options=java_options, memory=memory)
        self.port = port or None
        self.web_ui_port = web_ui_port or None

    @property
    def url(self) -> str:
        """``spark://host:port``.

        Raises:
            SparkClusterProvisioningError: not started or attached.
        """
        return self.address

    @property
    def web_ui_url(self) -> str:
        """``http://host:web_ui_port`` (its ``/json/`` is :meth:`status`).

        Raises:
            SparkClusterProvisioningError: not started or attached.
        """
        if self.web_ui_port is None:
            raise SparkClusterProvisioningError(f"Spark master in {self.state_dir} is not started")
        return f"http://{self.host}:{self.web_ui_port}"

    def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The master's ``/json/`` (``aliveworkers``, ``workers``, ``activeapps``, ``completedapps``, ...).

        Raises:
            SparkClusterProvisioningError: it did not answer within ``timeout_s`` seconds.
        """
        document = _http_json(f"{self.web_ui_url}/json/", timeout_s)
        if document is None:
            raise SparkClusterProvisioningError(f"Spark master {self.web_ui_url}/json/ did not answer")
        return document

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> Self:
        """Launch the master and wait (up to ``timeout_s`` seconds) until its ``/json/`` says ALIVE.

        Picked ports that another process took meanwhile are replaced and the start tried again
        (3 attempts).

        Raises:
            SparkClusterProvisioningError: already running in ``state_dir``, no PySpark or Java, the
                JVM exited or did not answer in time (its output's tail is quoted).
        """
        self._refuse_second_start()
        fixed_port, fixed_ui = self.port is not None, self.web_ui_port is not None

        def pick_ports() -> bool:
            if not fixed_port:
                self.port = free_port(self.host, exclude={self.web_ui_port or 0})
            if not fixed_ui:
                self.web_ui_port = free_port(self.host, exclude={self.port or 0})
            return not (fixed_port and fixed_ui)

        return self._start_retrying(pick_ports, lambda: ["--host", self.host, "--port", str(self.port),
                                                         "--webui-port", str(self.web_ui_port)], timeout_s, detach)

    def _address(self) -> str | None:
        return None if self.port is None else f"spark://{self.host}:{self.port}"

    def _probe(self, timeout_s: float) -> bool:
        document = _http_json(f"{self.web_ui_url}/json/", timeout_s)
        return document is not None and document.get("status") == "ALIVE"

    def _state(self) -> dict[str, Any]:
        return {"url": self.url, "web_ui_url": self.web_ui_url, "host": self.host, "port": self.port,
                "web_ui_port": self.web_ui_port}

    @classmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        return cls(state_dir, host=state.get("host", "127.0.0.1"), port=int(state["port"]),
                   web_ui_port=int(state["web_ui_port"]))


class SparkWorker(_SparkDaemon):
    """A standalone worker (``org.apache.spark.deploy.worker.Worker``) registered with ``master``.

    Args:
        state_dir: folder for ``worker.out``, ``worker.json``, ``spark.conf`` and ``work/`` (the
            executors' folders, ``--work-dir``); created if missing.
        master: the running :class:`SparkMaster`.
        cores: cores it offers (``--cores``); worker_memory: memory it offers to executors (``--memory``,
            e.g. ``1g``); memory: the worker daemon's own heap (``SPARK_DAEMON_MEMORY``).
        port: its RPC port; 0 picks a free one. Its web UI takes any free port.
    """

    service_name = "Spark worker"
    state_file = "worker.json"
    address_key = "address"
    output_files = (("worker.out", 40),)
    main_class = WORKER_CLASS

    def __init__(self, state_dir: Path | str, master: SparkMaster, *, cores: int = 1, worker_memory: str = "1g",
                 port: int = 0, host: str = "127.0.0.1", java_options: Sequence[str] = DAEMON_JAVA_OPTIONS,
                 memory: str = DAEMON_MEMORY) -> None:
        super().__init__(state_dir, host=host, java_options=java_options, memory=memory)
        self.master = master
        self.cores = cores
        self.worker_memory = worker_memory
        self.port = port or None
        self._fixed_port = self.port is not None

    @property
    def work_dir(self) -> Path:
        """``--work-dir``: ``<app id>/<executor id>/`` folders of the executors it launched."""
        return self.state_dir / "work"

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> Self:
        """Launch the worker and wait (up to ``timeout_s`` seconds) until the master lists it ALIVE.

        Raises:
            SparkClusterProvisioningError: already running in ``state_dir``, the JVM exited or was
                not registered in time (its output's tail is quoted).
        """
        self.launch(detach=detach)
        return self.await_registered(timeout_s, detach=detach)

    def launch(self, *, detach: bool = False) -> None:
        """The first half of :meth:`start`: launch the JVM, without waiting. Call it from a thread
        that lives as long as the worker should (the parent-death signal follows the launching thread).

        Raises:
            SparkClusterProvisioningError: already running in ``state_dir``, no PySpark or Java.
        """
        self._refuse_second_start()
        if not self._fixed_port:
            self.port = free_port(self.host)
        self._launch(self._arguments(), detach)

    def await_registered(self, timeout_s: float = 120.0, *, detach: bool = False, relaunch: bool = True) -> Self:
        """The second half of :meth:`start`: wait until the master lists the worker ALIVE. When a
        picked port was taken meanwhile, ``relaunch`` launches the worker again on a new one from
        this thread (then call it from the launching thread); without it the error is raised
        (:meth:`port_was_taken` tells).

        Raises:
            SparkClusterProvisioningError: the JVM exited or was not registered in ``timeout_s``
                seconds from its launch (its output's tail is quoted).
        """
        try:
            self._await_jvm(timeout_s)
            return self
        except SparkClusterProvisioningError:
            if not relaunch or self._fixed_port or not self.port_was_taken():
                raise

        def pick_port() -> bool:
            self.port = free_port(self.host)
            return True

        return self._start_retrying(pick_port, self._arguments, timeout_s, detach)

    def _arguments(self) -> list[str]:
        return [self.master.url, "--host", self.host, "--port", str(self.port), "--webui-port", "0",
                "--cores", str(self.cores), "--memory", self.worker_memory, "--work-dir", str(self.work_dir)]

    def _address(self) -> str | None:
        return None if self.port is None else f"{self.host}:{self.port}"

    def _probe(self, timeout_s: float) -> bool:
        document = _http_json(f"{self.master.web_ui_url}/json/", timeout_s) or {}
        return any(w.get("host") == self.host and w.get("port") == self.port and w.get("state") == "ALIVE"
                   for w in document.get("workers", ()))

    def _state(self) -> dict[str, Any]:
        return {"address": self._address(), "host": self.host, "port": self.port, "cores": self.cores,
                "worker_memory": self.worker_memory, "master_state_dir": str(self.master.state_dir)}

    @classmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        master = SparkMaster.attach(state["master_state_dir"])
        return cls(state_dir, master, cores=int(state["cores"]), worker_memory=state["worker_memory"],
                   port=int(state["port"]), host=state.get("host", "127.0.0.1"))


class LocalSparkCluster:
    """A master and ``workers`` workers on ``host`` (loopback), started and stopped together.

    Args:
        state_dir: the cluster's folder (``master/``, ``worker-<i>/``: see the module docstring).
        workers: how many workers (each launches one executor JVM per application).
        cores_per_worker: ``--cores`` of each worker; memory_per_worker: ``--memory`` (executor
            memory it offers; an application's ``spark.executor.memory`` defaults to 1g).
        port / web_ui_port: the master's (0: free ones, picked at start).

    Raises (:meth:`start`): :class:`~materializer.adapters.errors.SparkClusterProvisioningError`.
    """

    def __init__(self, state_dir: Path | str, *, workers: int = 2, cores_per_worker: int = 1,
                 memory_per_worker: str = "1g", host: str = "127.0.0.1", port: int = 0, web_ui_port: int = 0) -> None:
        if workers < 1 or cores_per_worker < 1:
            raise ValueError(f"a cluster needs at least one worker and one core each, got {workers} x {cores_per_worker}")
        self.state_dir = Path(state_dir).resolve()
        self.master = SparkMaster(self.state_dir / "master", host=host, port=port, web_ui_port=web_ui_port)
        self.workers = [SparkWorker(self.state_dir / f"worker-{i}", self.master, cores=cores_per_worker,
                                    worker_memory=memory_per_worker, host=host) for i in range(workers)]
        self.startup_s: float | None = None

    @property
    def master_url(self) -> str:
        """``spark://host:port``: the ``master`` of :func:`~materializer.spark.jobs.spark_session` and ``--master``."""
        return self.master.url

    def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The master's ``/json/`` (see :meth:`SparkMaster.status`)."""
        return self.master.status(timeout_s)

    def executor_dirs(self, app_id: str) -> list[Path]:
        """The executor folders (``work/<app_id>/<executor id>``) of application ``app_id``, over all workers."""
        return sorted(d for w in self.workers for d in (w.work_dir / app_id).glob("*") if d.is_dir())

    def start(self, timeout_s: float = 120.0) -> Self:
        """Start the master, then every worker at once; return when all are registered ALIVE.

        Raises:
            SparkClusterProvisioningError: a daemon failed to start (the others are stopped again).
        """
        started = time.monotonic()
        try:
            self.master.start(timeout_s)
            remaining = max(10.0, timeout_s - (time.monotonic() - started))
            for worker in self.workers:  # launched from this thread: the parent-death signal follows the thread
                worker.launch()
            with ThreadPoolExecutor(len(self.workers)) as pool:  # only waits (HTTP probes)
                waits = [pool.submit(w.await_registered, remaining, relaunch=False) for w in self.workers]
            for worker, wait in zip(self.workers, waits):
                error = wait.exception()
                if error is not None:
                    if not worker.port_was_taken():
                        raise error
                    worker.start(remaining)  # on a new port, launched from this thread
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the workers (and the executors in their process groups), then the master. Idempotent.

        Raises:
            SparkClusterProvisioningError: a daemon survived SIGKILL.
        """
        errors = []
        for daemon in [*self.workers, self.master]:
            try:
                daemon.stop(timeout_s)
            except SparkClusterProvisioningError as exc:
                errors.append(str(exc))
        if errors:
            raise SparkClusterProvisioningError("; ".join(errors))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m materializer.spark.standalone``: run a cluster until Ctrl-C or SIGTERM."""
    import signal
    import tempfile

    parser = argparse.ArgumentParser(description="A Spark standalone cluster on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a new temporary folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores-per-worker", type=int, default=1)
    parser.add_argument("--memory-per-worker", default="1g")
    parser.add_argument("--port", type=int, default=0, help="the master's port (default: a free one)")
    parser.add_argument("--web-ui-port", type=int, default=0, help="the master's web UI port (default: a free one)")
    args = parser.parse_args(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="spark-standalone-"))

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # stop the daemons as Ctrl-C does
    with LocalSparkCluster(state_dir, workers=args.workers, cores_per_worker=args.cores_per_worker,
                           memory_per_worker=args.memory_per_worker, port=args.port,
                           web_ui_port=args.web_ui_port) as cluster:
        print(f"{cluster.master_url} (web UI {cluster.master.web_ui_url}, state {state_dir}); Ctrl-C stops it",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
