"""Hosts of their own for the suites that start clusters (test_spark.py, test_ray.py): three
network namespaces "<prefix><pid>-l", "-a" and "-b"; "a" (NET.1) and "b" (NET.2) each have a veth
to a bridge in "l" (NET.254). Every address and packet stays inside them. A guard process in a
session of its own waits for the test's end of a pipe to close, however the test ends, then kills
every process in the namespaces and deletes them; namespaces whose test process is gone (a guard
killed too) go at the next run of a suite with the same prefix."""

import os
import re
import shutil
import subprocess
import sys

GUARD = r"""
import os, subprocess, sys, time
names = sys.argv[1:]
sys.stdin.read()
for _ in range(3):
    inos = set()
    for n in names:
        try:
            inos.add(os.stat("/var/run/netns/" + n).st_ino)
        except OSError:
            pass
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and os.stat("/proc/%s/ns/net" % p).st_ino in inos:
                os.kill(int(p), 9)
        except OSError:
            pass
    time.sleep(0.2)
for n in names:
    subprocess.run(["ip", "netns", "del", n], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


def _guard(names):
    return subprocess.Popen([sys.executable, "-c", GUARD] + names, stdin=subprocess.PIPE, start_new_session=True)


def _stale_namespaces(prefix):
    stale = []
    for n in os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []:
        m = re.match(re.escape(prefix) + r"(\d+)-[lab]$", n)
        if m:
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                stale.append(n)
            except PermissionError:
                pass
    if stale:
        g = _guard(stale)
        g.stdin.close()
        g.wait(60)


def make_hosts(prefix, net, log):
    """(the three namespaces {"l": name, "a": ..., "b": ...}, their guard, None), or (None, None,
    why not) when they cannot be made here. Closing the guard's stdin (guard.stdin.close();
    guard.wait(60)) removes them. net: the first three bytes of the addresses, "10.78.0"."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return None, None, "needs root and iproute2's ip"
    _stale_namespaces(prefix)
    ns = {x: "%s%d-%s" % (prefix, os.getpid(), x) for x in "lab"}
    guard = _guard(list(ns.values()))  # from here on, however the test ends, the namespaces go

    def sh(*argv):
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.write("$ %s\n%s" % (" ".join(argv), r.stdout))
        if r.returncode:
            raise RuntimeError("%s: %s" % (" ".join(argv), r.stdout.strip()))
    try:
        for x in "lab":
            sh("ip", "netns", "add", ns[x])
            sh("ip", "-n", ns[x], "link", "set", "lo", "up")
        sh("ip", "-n", ns["l"], "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", ns["l"], "link", "set", "br0", "up")
        sh("ip", "-n", ns["l"], "addr", "add", net + ".254/24", "dev", "br0")
        for x, addr in (("a", 1), ("b", 2)):
            sh("ip", "-n", ns["l"], "link", "add", "v" + x, "type", "veth", "peer", "name", "eth0", "netns", ns[x])
            sh("ip", "-n", ns["l"], "link", "set", "v" + x, "master", "br0", "up")
            sh("ip", "-n", ns[x], "addr", "add", "%s.%d/24" % (net, addr), "dev", "eth0")
            sh("ip", "-n", ns[x], "link", "set", "eth0", "up")
    except (RuntimeError, OSError) as e:
        guard.stdin.close()
        guard.wait(60)
        return None, None, str(e)
    return ns, guard, None
