"""What the launchers that run kolo's ranks as another framework's tasks share (kolo.spark's
barrier tasks, kolo.ray's actors): where each rank goes, a free port for rank 0's store, and
which failures are only the consequence of another rank's."""

import socket


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
