"""kolo.spark.run_elastic's parts: Spark tasks that hold slots and start workers for kolorun.

The job is a kolorun elastic job on the driver's machine (kolo/_elastic_driver.py). Spark gives
it slots: one Spark job of max_num_proc tasks, each an *agent* that connects to the driver's
service, says its host's address (the one its route to the driver leaves from), and waits. A
host's slots are its connected agents. kolorun starts a worker on a host through its --ssh
program (kolo/_relay.py); the driver hands the command to a free agent of that host, which runs
it as sshd would (kolo._relay.serve_command) and, when it ends, waits for the next one. An agent
whose task is lost (its executor died, the job was cancelled) loses its slot, and the worker it
ran is lost with it: the relay exits 255, and the worker's own lifeline ends it. A task Spark
starts again (its retry, on a new executor) is a new slot, and the job grows back.

Workers on the driver's own machine (local[N] Spark) are kolorun's children; their agents hold
the slots only.
"""

import json
import secrets
import socket
import threading

from kolo import _relay
from kolo._elastic_driver import Handle, SpawnError


class _Agent:
    def __init__(self, conn, host):
        self.conn, self.host = conn, host
        self.busy = False
        self.lost = False
        self.where = None           # its answer to a command: {"addr", "port"}
        self.exited = threading.Event()
        self.answered = threading.Condition()


class SparkBackend:
    """The agents that connected, by host."""

    def __init__(self, start_timeout):
        self.start_timeout = start_timeout
        self.gone = None            # why no agent can come any more (their Spark job failed)
        self.agents = []
        self.lock = threading.Lock()

    def nodes(self):
        with self.lock:
            hosts = {}
            for a in self.agents:
                hosts[a.host] = hosts.get(a.host, 0) + 1
            return hosts

    def slots(self):
        with self.lock:
            return len(self.agents)

    def agent(self, conn, hello, closed):
        """An agent's connection, for its life: registers it, then reads its answers."""
        host = str(hello.get("host", ""))
        if not host or any(c.isspace() for c in host):
            return
        a = _Agent(conn, host)
        with self.lock:
            self.agents.append(a)
        try:
            while not closed.is_set():
                kind, body = _relay.recv(conn)
                if kind is None:
                    break
                msg = json.loads(body)
                if kind == _relay.REPLY:
                    with a.answered:
                        a.where = msg
                        a.answered.notify_all()
                elif kind == _relay.EXIT:
                    a.exited.set()
        except (OSError, _relay.WireError, ValueError):
            pass
        finally:
            with self.lock:
                self.agents.remove(a)
            with a.answered:
                a.lost = True
                a.answered.notify_all()
            a.exited.set()

    def spawn(self, host, command):
        with self.lock:
            a = next((x for x in self.agents if x.host == host and not x.busy), None)
            if a is None:
                raise SpawnError("no free Spark task on host %s (its tasks are busy or gone)" % host)
            a.busy, a.where = True, None
            a.exited.clear()
        token = secrets.token_hex(16)
        try:
            _relay.send_json(a.conn, _relay.REPLY, {"token": token, "command": command})
        except OSError as e:
            a.busy = False
            raise SpawnError("the Spark task on %s is gone: %s" % (host, e)) from None
        with a.answered:
            a.answered.wait_for(lambda: a.where is not None or a.lost, timeout=self.start_timeout)
        if a.where is None or "port" not in a.where:
            a.busy = False
            raise SpawnError("the Spark task on %s did not take the command: %s"
                             % (host, "its task was lost" if a.lost else (a.where or {}).get("error", "no answer")))
        return Handle(a.where["addr"], a.where["port"], token, agent=a)

    def watch(self, handle, closed):
        a = handle.agent
        while not closed.is_set():
            if a.exited.wait(0.5):
                return "its Spark task on %s was lost" % a.host if a.lost else None
        return None

    def release(self, handle):
        handle.agent.busy = False

    def close(self):
        """The job is over: every agent's connection ends, and with it its Spark task."""
        with self.lock:
            conns = [a.conn for a in self.agents]
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def agent_task(spec, index):
    """A Spark task's body: an agent until the driver closes its connection. Yields the index."""
    host, port = spec["driver"].rsplit(":", 1)
    s = _relay.connect(host.strip("[]"), int(port), timeout=60)
    mine = s.getsockname()[0]
    _relay.send_json(s, _relay.HELLO, {"key": spec["key"], "op": "agent", "host": mine, "task": index})
    while True:
        try:
            kind, body = _relay.recv(s)
        except (OSError, _relay.WireError):
            break
        if kind != _relay.REPLY:
            break
        job = json.loads(body)
        listener = _relay.listen()
        try:
            _relay.send_json(s, _relay.REPLY, {"addr": mine, "port": listener.getsockname()[1]})
        except OSError:
            break
        code = _relay.serve_command(listener, job["token"], job["command"], _relay.command_env(spec.get("env")))
        try:
            _relay.send_json(s, _relay.EXIT, {"code": code})
        except OSError:
            break
    s.close()
    yield index
