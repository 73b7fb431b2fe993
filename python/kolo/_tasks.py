"""What the launchers that run kolo's ranks as another framework's tasks share (kolo.spark's
barrier tasks, kolo.ray's actors): where each rank goes, a free port for rank 0's store, and
which failures are only the consequence of another rank's."""

import socket
import threading
import time

from kolo import _relay


def placement(hosts):
    """For tasks on the given hosts (by task index): each task's (rank, local rank, local size,
    cross rank, cross size). The ranks of a host are consecutive, hosts in the order of their
    first task, a host's tasks in their order: the first task is rank 0."""
    order = []
    for h in hosts:
        if h not in order:
            order.append(h)
    ranked = sorted(range(len(hosts)), key=lambda i: (order.index(hosts[i]), i))
    rank_of = {i: r for r, i in enumerate(ranked)}
    out = []
    for i, h in enumerate(hosts):
        mine = [j for j in ranked if hosts[j] == h]
        out.append((rank_of[i], mine.index(i), len(mine), order.index(h), len(order)))
    return out


def free_port():
    """A TCP port free on this host now (rank 0's store binds it a moment later)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def reports_another_rank(message):
    """True for a HorovodInternalError's message (as a traceback's last line gives it) that
    reports another rank's failure, in kolo's wording for lost, departed and aborting peers: the
    rank named as a job's cause is one that failed on its own, not one that failed because of it."""
    return "HorovodInternalError" in message and any(
        w in message for w in ("lost rank", "left the job", "aborted the job", "peer lost", "was lost"))


def check_call(who, fn, args, kwargs, num_proc):
    """The arguments every launcher of a function on N ranks takes (kolo.run, kolo.spark.run):
    TypeError or ValueError naming the launcher and the argument. num_proc None: the default."""
    if not callable(fn):
        raise TypeError("%s: fn must be callable, got %s" % (who, type(fn).__name__))
    if not isinstance(args, (tuple, list)):
        raise TypeError("%s: args must be a tuple or list, got %s" % (who, type(args).__name__))
    if not isinstance(kwargs, dict):
        raise TypeError("%s: kwargs must be a dict, got %s" % (who, type(kwargs).__name__))
    if num_proc is not None and (not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1):
        raise ValueError("%s: num_proc must be a positive integer, got %r" % (who, num_proc))


class Server:
    """A driver's port that the ranks connect to (kolo.run's, kolo.spark.run's): a thread accepts,
    and a thread per connection runs self._serve(conn), which reads the connection's hello through
    self.handshakes.read (at most _relay.HANDSHAKES_MAX at once). Subclasses set self.lock before
    _listen."""

    def _listen(self, sock, name):
        self.sock, self.port, self._name = sock, sock.getsockname()[1], name
        self.closed, self.serving = False, []
        self.handshakes = _relay.Handshakes(name)
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    def _accept(self):
        while True:
            got = _relay.accept(self.sock, lambda: self.closed, self._name)
            if got is None:
                return
            self._spawn(*got)

    def _spawn(self, conn, peer):
        self.handshakes.enter(conn, peer)  # its _serve reads the hello through self.handshakes.read
        t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
        t.start()  # before _stop can see it: joining a thread not yet started raises
        with self.lock:
            # the ended ones go: strangers' connections, each a thread, would pile up here
            self.serving = [s for s in self.serving if s.is_alive()] + [t]

    def _stop(self, wait_s, take_queued=False):
        """Stops accepting, then joins the serving threads, all within wait_s seconds in total:
        their ranks have ended, so each is at or near its end; a stranger's idle connection may
        hold one longer, and it is left, a daemon. take_queued: first serve the connections still
        in the listener's backlog (a rank's last words may wait there when the job ends)."""
        self.closed = True
        if take_queued:
            self.sock.setblocking(False)
            while True:
                try:
                    conn, peer = self.sock.accept()
                except OSError:
                    break
                conn.setblocking(True)
                self._spawn(conn, peer)
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            serving = list(self.serving)
        deadline = time.monotonic() + wait_s
        for t in serving:
            t.join(max(0.0, deadline - time.monotonic()))
