"""kolo._relay: kolorun's workers started through another framework's processes instead of ssh.

kolorun starts a remote worker as `SSH [options] HOST COMMAND` (its --ssh program) and watches that
process: what it writes is the worker's output, its exit status the worker's, and closing its
stdin ends the worker (the remote wrapper's lifeline). This file is such a program, and the other
end of it:

* run as a script (`python3 .../kolo/_relay.py -T -o ... HOST COMMAND`, kolorun's --ssh), it asks
  the driver's service (KOLO_DRIVER_SERVICE, a port on this machine, KOLO_DRIVER_KEY its secret) to start
  COMMAND on HOST; the service starts a process there (a Ray actor, a Spark task's: see
  kolo/_elastic_driver.py) that runs
  `/bin/sh -c COMMAND` as sshd would and answers with where to reach it. This end then relays its
  stdin there and the command's stdout and stderr here, and exits with the command's status:
  128 + N when signal N ended it, and 255, as ssh does, when the command could not be started or
  the connection to it was lost (kolorun then counts the host as failed).
* serve_command() is the far end: it runs the command and serves one connection, whose loss
  ends the command the way a lost ssh connection does (its stdin closed, then SIGTERM where sshd
  would send SIGHUP).

Standard library only, and nothing of kolo's imported: kolorun runs this with the environment
it gives remote workers (kolo's variables, no PYTHONPATH).

The wire: frames of a type byte, a 4-byte big-endian length and that many bytes. A connection
opens with a HELLO frame (JSON with the secret, or the one-use token the service handed out);
then STDIN frames one way (an empty one is the end of stdin), STDOUT/STDERR frames the other and
one EXIT frame (JSON: {"code": N} or {"lost": why}) last.
"""

import errno
import hmac
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

HELLO, REPLY, STDIN, STDOUT, STDERR, EXIT, DATA = b"H", b"R", b"I", b"O", b"E", b"X", b"P"
MAX_FRAME = 1 << 30
LOST = 255


class WireError(Exception):
    """A peer closed the connection mid-frame or sent something that is not a frame."""


def send(sock, kind, payload=b"", lock=None):
    if isinstance(payload, str):
        payload = payload.encode()
    data = kind + struct.pack(">I", len(payload)) + payload
    if lock is None:
        sock.sendall(data)
    else:
        with lock:
            sock.sendall(data)


def send_json(sock, kind, obj, lock=None):
    send(sock, kind, json.dumps(obj), lock)


def _exactly(sock, n):
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            return None if not buf else bytes(buf)
        buf += got
    return bytes(buf)


def recv(sock):
    """The next frame as (type, payload); (None, b"") at a clean end of the connection."""
    head = _exactly(sock, 5)
    if head is None:
        return None, b""
    if len(head) < 5:
        raise WireError("the connection ended inside a frame's header")
    kind, n = head[:1], struct.unpack(">I", head[1:])[0]
    if kind not in (HELLO, REPLY, STDIN, STDOUT, STDERR, EXIT, DATA) or n > MAX_FRAME:
        raise WireError("not a kolo relay frame (type %r, %d bytes)" % (kind, n))
    body = _exactly(sock, n) if n else b""
    if body is None or len(body) < n:
        raise WireError("the connection ended inside a frame")
    return kind, body


def recv_json(sock, want):
    kind, body = recv(sock)
    if kind != want:
        raise WireError("expected a %r frame, got %r" % (want, kind))
    try:
        return json.loads(body)
    except ValueError as e:
        raise WireError("a garbled %r frame: %s" % (want, e)) from None


# What a connection says before it has proven itself (the drivers' ports: kolo.run's service, the
# elastic driver's, kolo.spark's output channel, a served command's port): its hello, within
# HELLO_TIMEOUT seconds in all and HELLO_MAX bytes. A stranger's claimed length was read whole
# (up to MAX_FRAME, 1 GiB, into memory) and each recv had the timeout anew, so one that sent a byte
# now and then held its connection and thread for ever. A spawn request carries its command line,
# at most ARG_MAX (2 MiB on Linux) as kolorun hands it to this script.
HELLO_MAX = 4 << 20
HELLO_TIMEOUT = 10.0


def _exactly_by(sock, n, deadline, what):
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no %s within its time" % what)
        sock.settimeout(left)
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            raise WireError("the connection ended inside its %s" % what)
        buf += got
    return bytes(buf)


def recv_hello(sock, timeout=None, limit=HELLO_MAX):
    """The HELLO frame a connection opens with, as JSON: WireError for anything else or a length
    over limit (not read), socket.timeout when it has not all come within timeout seconds
    (HELLO_TIMEOUT by default). The socket is left with a timeout of what remained."""
    deadline = time.monotonic() + (HELLO_TIMEOUT if timeout is None else timeout)
    head = _exactly_by(sock, 5, deadline, "hello")
    kind, n = head[:1], struct.unpack(">I", head[1:])[0]
    if kind != HELLO:
        raise WireError("expected a %r frame, got %r" % (HELLO, kind))
    if n > limit:
        raise WireError("a hello of %d bytes (at most %d)" % (n, limit))
    try:
        return json.loads(_exactly_by(sock, n, deadline, "hello"))
    except ValueError as e:
        raise WireError("a garbled hello: %s" % e) from None


def recv_line(sock, limit, timeout=None):
    """A line (without its newline) a connection opens with, read byte by byte so that what
    follows stays in the socket: WireError past limit bytes or at the end, socket.timeout after
    timeout seconds in all (HELLO_TIMEOUT by default)."""
    deadline = time.monotonic() + (HELLO_TIMEOUT if timeout is None else timeout)
    line = bytearray()
    while len(line) <= limit:
        c = _exactly_by(sock, 1, deadline, "first line")
        if c == b"\n":
            return bytes(line)
        line += c
    raise WireError("a first line over %d bytes" % limit)


def accept(sock, closed, name):
    """The next connection on a driver's listening socket, or None once closed() or the socket is
    gone (socket.timeout where the socket has a timeout). Out of descriptors (strangers holding them, each at most its hello's time), it waits and
    tries again: the accepting thread ended at the first such error, and the ranks that connected
    after it were never served (their connections completed in the backlog and waited for ever)."""
    said = False
    while not closed():
        try:
            return sock.accept()
        except socket.timeout:
            raise  # a listener with a timeout: its caller's turn
        except OSError as e:
            if closed():
                return None
            if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                continue
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                return None
            if not said:
                sys.stderr.write("kolo: %s cannot accept a connection (%s); trying again as connections end\n"
                                 % (name, os.strerror(e.errno)))
                said = True
            time.sleep(0.05)
    return None


class Refusals:
    """Lines about the connections a driver's port turned away: the first 10 of each 10 s, then
    how many more, said with the first refusal after those 10 s (a port scan wrote one line per
    connection)."""

    def __init__(self, name):
        self.name, self.lock = name, threading.Lock()
        self.since, self.said, self.more = -1e9, 0, 0

    def say(self, text):
        now = time.monotonic()
        with self.lock:
            if now - self.since >= 10:
                if self.more:
                    sys.stderr.write("kolo: %s turned away %d more connection%s in the 10 s before\n"
                                     % (self.name, self.more, "" if self.more == 1 else "s"))
                self.since, self.said, self.more = now, 0, 0
            if self.said < 10:
                self.said += 1
                sys.stderr.write("kolo: %s\n" % text)
            else:
                self.more += 1


# How many connections of a driver's port may be in their hello at once. Each holds a thread and a
# descriptor for up to HELLO_TIMEOUT, and there was no bound: strangers connecting faster than
# their hellos ran out took every descriptor (then the port waited, accept() failing, until theirs
# ended) and a thread each. Ranks say their hello at once, so a full table is strangers' (the
# rendezvous store's C side holds 256 so, KOLO_STORE_PENDING_MAX). 128 is more than the
# connections a driver's ranks open together: each rank opens one at a time.
HANDSHAKES_MAX = 128


class Handshakes:
    """The connections of a driver's port that have not said their hello yet, at most limit: one
    more closes the oldest of the address holding the most (a flood from one place gives way
    first, and its newest connections, where a rank's would be among them, stay). The accepting
    thread enters each connection; the thread reading its hello reads it through read(), which
    takes it out again before the caller can close it (so that no close races a shutdown here)."""

    def __init__(self, name, limit=None):
        self.name, self.limit, self.lock = name, limit or HANDSHAKES_MAX, threading.Lock()
        self.open = {}  # connection -> (host, when it was accepted)
        self.since, self.closed = -1e9, 0

    def enter(self, conn, peer):
        with self.lock:
            if len(self.open) >= self.limit:
                self._close_one()
            self.open[conn] = (peer[0] if isinstance(peer, tuple) else str(peer), time.monotonic())

    def read(self, conn, reader, *args):
        """reader(conn, *args), the hello's read, with conn among the open handshakes meanwhile."""
        try:
            return reader(conn, *args)
        finally:
            with self.lock:
                self.open.pop(conn, None)

    def close_all(self):
        """Ends every connection still in its hello (their readers close them)."""
        with self.lock:
            for conn in self.open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.open.clear()

    def _close_one(self):
        count = {}
        for host, _ in self.open.values():
            count[host] = count.get(host, 0) + 1
        host = max(count, key=count.get)
        conn = min((c for c, (h, _) in self.open.items() if h == host), key=lambda c: self.open[c][1])
        del self.open[conn]
        try:
            conn.shutdown(socket.SHUT_RDWR)  # its reader wakes at the end, and closes it
        except OSError:
            pass
        now = time.monotonic()
        if now - self.since >= 10:  # the first of each 10 s says what is going on, with the count before
            more = " (%d more in the 10 s before)" % self.closed if self.closed else ""
            sys.stderr.write("kolo: %s has %d connections in their hello, %d of them from %s: closing the oldest "
                             "from there (a port scan or a flood?)%s\n"
                             % (self.name, len(self.open) + 1, count[host], host, more))
            self.since, self.closed = now, 0
        else:
            self.closed += 1


def listen(backlog=4):
    """A TCP socket listening on every interface at a free port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 0))
    s.listen(backlog)
    return s


def connect(host, port, timeout=30):
    s = socket.create_connection((host, port), timeout=timeout)
    s.settimeout(None)
    keepalive(s)
    return s


def keepalive(s):
    """A peer whose host vanished is noticed within ~25 s (idle 10 s, then 3 probes 5 s apart)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt, v in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), v)


# ---- the far end: the command's host ----

def command_env(extra=None):
    """The environment a served command gets: this process's, extra on top, and kolo importable
    by the command's python as it is by this one."""
    env = dict(os.environ, **(extra or {}))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def exit_code(status):
    """A Popen returncode as a shell reports it (128 + N for signal N)."""
    return 128 - status if status < 0 else status


def _first_proven(listener, token, timeout):
    """The first connection on listener whose hello says token within timeout seconds, or None.
    Hellos are read beside each other: read one at a time, each silent stranger held the port for
    its hello's time (10 s) while the right connection waited behind it, and a stream of them, each
    accept having the timeout anew, kept it waiting for ever."""
    proven = []
    lock = threading.Lock()
    handshakes = Handshakes("a served command's port")

    def check(conn):
        try:
            hello = handshakes.read(conn, recv_hello)
            ok = isinstance(hello, dict) and hmac.compare_digest(str(hello.get("token", "")), token)
        except (OSError, WireError):
            ok = False
        with lock:
            if ok and not proven:
                proven.append(conn)
                return
        conn.close()  # a stranger, or a second proven one after the first

    deadline = time.monotonic() + timeout
    listener.settimeout(0.05)  # between connections the loop looks for a winner (a start 50 ms later at most)
    while True:
        with lock:
            if not proven and time.monotonic() >= deadline:
                proven.append(None)  # one proven later is closed by check
            if proven:
                handshakes.close_all()  # strangers still in their hellos need not hold theirs
                return proven[0]
        try:
            got = accept(listener, lambda: False, "a served command's port")
        except socket.timeout:
            continue
        if got is None:
            raise OSError("a served command's port is gone")
        conn, peer = got
        conn.settimeout(None)
        handshakes.enter(conn, peer)
        threading.Thread(target=check, args=(conn,), daemon=True).start()


def serve_command(listener, token, command, env=None, accept_timeout=60):
    """Waits on listener for the connection that says token (strangers are turned away), runs
    `/bin/sh -c command` there and relays it; returns its exit code (LOST when no one came within
    accept_timeout seconds).
    When the connection is lost before the command ends, the command's stdin is closed and it
    gets SIGTERM (sshd would hang it up)."""
    conn = _first_proven(listener, token, accept_timeout)
    listener.close()
    if conn is None:
        return LOST
    conn.settimeout(None)
    keepalive(conn)
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    lock = threading.Lock()
    ended = threading.Event()

    def pump(stream, kind):
        fd = stream.fileno()
        broken = False
        while True:
            data = os.read(fd, 65536)
            if not data:
                return
            if not broken:  # after the connection broke, the output is still drained
                try:
                    send(conn, kind, data, lock)
                except OSError:
                    broken = True

    def feed():
        """stdin frames to the command; the connection's end (its peer died, or the network
        went and keepalive gave up) ends the command, as sshd's hang-up does."""
        closed = False
        try:
            while True:
                kind, data = recv(conn)
                if kind is None:
                    break
                if kind == STDIN and not data and not closed:
                    proc.stdin.close()
                    closed = True
                elif kind == STDIN and not closed:
                    proc.stdin.write(data)
                    proc.stdin.flush()
        except (OSError, WireError, ValueError):
            pass
        if not closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if proc.poll() is None and not ended.is_set():
            try:  # SIGTERM, not sshd's SIGHUP: a Ray worker may run with SIGHUP ignored, and so its children
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass

    pumps = [threading.Thread(target=pump, args=(proc.stdout, STDOUT), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, STDERR), daemon=True)]
    for t in pumps:
        t.start()
    threading.Thread(target=feed, daemon=True).start()
    code = exit_code(proc.wait())
    for t in pumps:  # what it wrote before it ended (a child it left behind may hold the pipes open)
        t.join(5)
    ended.set()
    try:
        send_json(conn, EXIT, {"code": code}, lock)
    except OSError:
        pass
    conn.close()
    return code


# ---- the near end: kolorun's --ssh ----

_SSH_OPTS_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def parse_ssh_args(argv):
    """ssh's command line as kolorun writes it: (host, command)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        letters = a[1:]
        for j, c in enumerate(letters):
            if c in _SSH_OPTS_WITH_VALUE:
                if j == len(letters) - 1:
                    i += 1  # the value is the next word
                break
        i += 1
    if i >= len(argv):
        raise ValueError("no host on the command line")
    host, command = argv[i], " ".join(argv[i + 1:])
    if not command:
        raise ValueError("no command for host %s" % host)
    return host, command


def _say(msg):
    sys.stderr.write("kolo relay: %s\n" % msg)
    sys.stderr.flush()


def main(argv):
    try:
        host, command = parse_ssh_args(argv)
    except ValueError as e:
        _say("%s (usage: _relay.py [ssh options] HOST COMMAND)" % e)
        return LOST
    port, key = os.environ.get("KOLO_DRIVER_SERVICE"), os.environ.get("KOLO_DRIVER_KEY")
    if not port or not key:
        _say("KOLO_DRIVER_SERVICE and KOLO_DRIVER_KEY are not set: this program is started by an elastic "
             "job's driver (kolo.ray.ElasticRayExecutor, kolo.spark.run_elastic) as kolorun's --ssh, not by hand")
        return LOST
    try:
        ctl = connect("127.0.0.1", int(port))
        send_json(ctl, HELLO, {"key": key, "op": "spawn", "host": host, "command": command})
        where = recv_json(ctl, REPLY)
    except (OSError, WireError, ValueError) as e:
        _say("cannot reach the driver's service at 127.0.0.1:%s: %s" % (port, e))
        return LOST
    if "error" in where:
        _say(where["error"])
        return LOST
    try:
        s = connect(where["addr"], where["port"])
        send_json(s, HELLO, {"token": where["token"]})
    except (OSError, KeyError) as e:
        _say("cannot reach the worker's process on %s: %s" % (host, e))
        return LOST

    def forward_stdin():
        try:
            while True:
                data = os.read(0, 65536)
                send(s, STDIN, data)
                if not data:
                    return
        except OSError:
            pass

    threading.Thread(target=forward_stdin, daemon=True).start()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    watched = [s, ctl]
    try:
        while True:
            ready, _, _ = select.select(watched, [], [])
            if ctl in ready:
                kind, body = recv(ctl)
                if kind == EXIT:
                    _say("the worker on %s was lost: %s" % (host, json.loads(body).get("lost", "?")))
                    return LOST
                if kind is None:  # the service is done with this worker (it ended): its exit
                    watched = [s]  # status is on its way on the other connection
                    ctl.close()
            if s in ready:
                kind, body = recv(s)
                if kind == STDOUT:
                    out.write(body)
                    out.flush()
                elif kind == STDERR:
                    err.write(body)
                    err.flush()
                elif kind == EXIT:
                    return int(json.loads(body)["code"])
                elif kind is None:
                    _say("the connection to the worker on %s was lost" % host)
                    return LOST
    except (OSError, WireError, ValueError) as e:
        _say("the connection to the worker on %s failed: %s" % (host, e))
        return LOST


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
