"""Elastic training's Python side (kolo.elastic, kolo.torch.elastic). Multi-rank (under kolorun -np 2
or 3, in a fixed job): states take rank 0's values on sync and roll back to the last commit on
restore; check_host_updates raises for the C check's answers; run()'s loop after a real failed
collective (with a real shutdown and init of every rank) and after HostsUpdatedInterrupt; a removed
worker exits cleanly; ElasticSampler shares out what is left of an epoch among any number of ranks
without losing or repeating samples; DistributedOptimizer and TorchState across shutdown and init.
Standalone (outside kolorun): a kolorun job of 3 loses a worker in the middle of an epoch, and the
other two re-form the job with new ranks (the launcher's part played by the test) and finish training;
a real elastic kolorun job grows from 2 workers to 3 in the middle of an epoch and the new worker gets
the state."""

import io
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo  # noqa: E402
import kolo.torch as hvd  # noqa: E402
from kolo import _lib, basics  # noqa: E402
from kolo import elastic as kel  # noqa: E402
from kolo.exceptions import KoloWorkerRemovedError  # noqa: E402
from conftest import ROOT  # noqa: E402


def n_r():
    return hvd.size(), hvd.rank()


def everyones(obj):
    """Every rank's obj, in rank order."""
    return hvd.allgather_object(obj, name="test.everyones")


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


@pytest.fixture
def fake_check(monkeypatch):
    """Makes kolo_elastic_check answer from a list (one answer per call, then 0), as the C side
    does in an elastic job: the status, and *update (KOLO_ELASTIC_ADDED 1, _REMOVED 2)."""
    answers = []

    def check(ptr):
        update = answers.pop(0) if answers else 0
        if isinstance(update, tuple):  # (status, update)
            status, update = update
        else:
            status = _lib.OK
        ptr._obj.value = update
        return status
    monkeypatch.setattr(_lib, "kolo_elastic_check", check)
    return answers


class CountingState(kel.ObjectState):
    def __init__(self, **kwargs):
        self.syncs = 0
        super().__init__(**kwargs)

    def sync(self):
        self.syncs += 1
        super().sync()


# ---- the generic states ----

def test_elastic_is_where_horovod_has_it():
    assert hvd.elastic.run and hvd.elastic.TorchState and hvd.elastic.ElasticSampler
    assert kolo.elastic.State and kolo.elastic.ObjectState and kolo.elastic.run
    assert hvd.HostsUpdatedInterrupt is kolo.HostsUpdatedInterrupt is kel.HostsUpdatedInterrupt
    assert issubclass(KoloWorkerRemovedError, ValueError)
    # this job is not elastic: the C side says so, and a check does not communicate
    assert not basics._elastic() and hvd.elastic_round() == kolo.elastic_round() == 0
    assert _lib.ERR_REMOVED == -17 and _lib.strerror(_lib.ERR_REMOVED) != _lib.strerror(_lib.ERR_STARTUP)


def test_object_state_sync_takes_rank_0s_values():
    n, r = n_r()
    state = kel.ObjectState(epoch=r, history=[r] * (r + 1), note="rank %d" % r)
    state.epoch, state.history = 10 + r, state.history + [r]  # current values, not the given ones, travel
    state.sync()
    assert everyones((state.epoch, state.history, state.note)) == [(10, [0, 0], "rank 0")] * n
    # sync() committed what it received: a rollback goes back there, not to this rank's values
    state.epoch = -1
    state.history.append(99)
    state.restore()
    assert (state.epoch, state.history) == (10, [0, 0])


def test_object_state_restore_rolls_back_to_the_last_commit():
    state = kel.ObjectState(epoch=0, history=[])
    state.epoch, state.history = 1, [1]
    state.commit()
    state.epoch = 2
    state.history.append(2)  # changed in place: the saved copy must not change with it
    state.restore()
    assert (state.epoch, state.history) == (1, [1])
    state.history.append(3)
    state.restore()
    assert state.history == [1]


def test_check_host_updates_raises_for_the_c_checks_answers(fake_check):
    state = kel.ObjectState(epoch=0)
    state.check_host_updates()  # the real check, outside an elastic job: nothing, at once
    fake_check[:] = [0, 1, 2, (_lib.ERR_PEER_LOST, 0)]
    state.check_host_updates()
    with pytest.raises(hvd.HostsUpdatedInterrupt) as added:
        state.check_host_updates()
    assert added.value.skip_sync is False
    with pytest.raises(hvd.HostsUpdatedInterrupt) as removed:
        state.check_host_updates()
    assert removed.value.skip_sync is True and "removed" in str(removed.value)
    with pytest.raises(hvd.HorovodInternalError):  # the check is a collective: it can fail
        state.check_host_updates()
    # commit() saves before it checks: the rollback after the interrupt keeps the new value
    fake_check[:] = [1]
    state.epoch = 5
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.commit()
    state.epoch = 6
    state.restore()
    assert state.epoch == 5


def test_on_hosts_updated_takes_horovods_flags():
    state = kel.ObjectState()
    state.on_hosts_updated(10, kel.REMOVED)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is True
    state.on_hosts_updated(5, kel.ADDED)  # older than the last one: ignored
    state.check_host_updates()
    state.on_hosts_updated(11, kel.ADDED)
    state.on_hosts_updated(12, kel.REMOVED)  # added and removed: the new workers need a sync
    with pytest.raises(hvd.HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is False
    state.check_host_updates()  # reported once only


# ---- run() ----

def test_run_after_a_failed_collective_restores_rejoins_and_syncs():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks to fail a collective")
    state = CountingState(step=0, log=[])
    sizes, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(kolo.size())])

    @kel.run
    def train(state, until):
        sizes.append(kolo.size())
        while state.step < until:
            state.step += 1
            state.log.append((state.step, len(sizes)))  # (step, which call of train made it)
            if state.step == 3 and len(sizes) == 1:
                # the ranks disagree on the shape: the allreduce fails on every rank
                kolo.allreduce(np.ones(r + 1), name="elastic.mismatch")
            state.commit()
        return state.step * 10

    assert train(state, 5) == 50
    assert state.log == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]  # step 3's first try was rolled back
    assert sizes == [n, n] and resets == [n] and state.syncs == 2
    assert kolo.is_initialized()
    assert kolo.allreduce(np.ones(1), op=kolo.Sum, name="elastic.after_run").tolist() == [n]


def test_run_after_hosts_updated(monkeypatch, fake_check):
    resets = []
    monkeypatch.setattr(kel, "_reset", lambda: resets.append("reset"))
    state = CountingState(step=0, log=[])
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append(state.step)])
    # commit 2 finds new workers (sync), commit 4 only lost ones (no sync)
    fake_check[:] = [0, 1, 0, 2]

    @kel.run
    def train(state):
        while state.step < 6:
            state.step += 1
            state.log.append(state.step)
            state.commit()
        return "done"

    assert train(state) == "done"
    assert state.log == [1, 2, 3, 4, 5, 6]  # nothing rolled back: an interrupt comes after a commit
    assert resets == ["reset", "reset"] and callbacks == [2, 4]
    assert state.syncs == 2  # the first call and after the added workers; none after the removal


def test_init_reports_a_removed_worker(monkeypatch):
    monkeypatch.setattr(_lib, "kolo_init", lambda: _lib.ERR_REMOVED)
    with pytest.raises(KoloWorkerRemovedError, match="kolo initialization failed"):
        kolo.init()


def test_a_removed_worker_exits_with_status_0(monkeypatch, fake_check, capfd):
    fake_check[:] = [1]
    state = kel.ObjectState(step=0)

    @kel.run
    def train(state):
        state.step += 1
        state.commit()  # a newer round: run() shuts down and inits, which finds this worker removed

    monkeypatch.setattr(_lib, "kolo_init", lambda: _lib.ERR_REMOVED)
    try:
        with pytest.raises(SystemExit) as e:
            train(state)
    finally:
        monkeypatch.undo()
        kolo.init()  # every rank went through the same: they join the job again together
    assert e.value.code == 0
    err = capfd.readouterr().err
    assert "was removed from the elastic job" in err and len(err.strip().splitlines()) == 1


# ---- kolo.torch.elastic ----

def small_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def momenta(opt):
    return [opt.state[p]["momentum_buffer"] for g in opt.param_groups for p in g["params"]]


def test_torch_state_sync_takes_rank_0s_model_optimizer_and_attributes():
    n, r = n_r()
    model = small_model(r)  # different weights and momenta on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(model, opt, r)
    root = hvd.broadcast(flat(list(model.parameters()) + momenta(opt)), 0, name="test.root_state")
    if n > 1:
        assert not torch.equal(root, flat(list(model.parameters()) + momenta(opt))) or r == 0
    state = hvd.elastic.TorchState(model, opt, epoch=r, batch=10 * r)
    state.sync()
    assert torch.equal(flat(list(model.parameters()) + momenta(opt)), root)
    assert (state.epoch, state.batch) == (0, 0)
    assert state.model is model and state.optimizer is opt


def test_torch_state_restore_rolls_back_to_the_last_commit():
    model = small_model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    train_step(model, opt, 1)
    state.epoch = 1
    state.commit()
    committed = flat(list(model.parameters()) + momenta(opt)).clone()
    train_step(model, opt, 2)
    state.epoch = 2
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # in place: the saved copy must not change with it
    assert not torch.equal(flat(list(model.parameters()) + momenta(opt)), committed)
    state.restore()
    assert torch.equal(flat(list(model.parameters()) + momenta(opt)), committed) and state.epoch == 1
    train_step(model, opt, 3)  # steps on the restored state must not reach the saved copy
    state.restore()
    assert torch.equal(flat(list(model.parameters()) + momenta(opt)), committed)
    # a replaced model is the one saved and restored from then on
    other = small_model(5)
    state.model = other
    state.commit()
    before = flat(other.parameters()).clone()
    with torch.no_grad():
        other[0].weight.zero_()
    state.restore()
    assert torch.equal(flat(other.parameters()), before)


def test_distributed_optimizer_and_state_across_shutdown_and_init():
    """What run() does after a failure in the middle of backward: the hooks have submitted
    allreduces; shutdown() ends them, restore() clears the optimizer's handles, init() joins again,
    and training goes on with the same optimizer and hooks."""
    n, r = n_r()
    torch.manual_seed(0)
    # a 128 KiB layer: its gradient's bucket goes mapped from the shared arena when the ranks share a host
    model = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.Tanh(), torch.nn.Linear(256, 128),
                                torch.nn.Linear(128, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt)
    train_step(model, opt, r)
    state.commit()
    loss = torch.nn.functional.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 2))
    try:
        loss.backward()  # its hooks submit allreduces, which are in flight at shutdown()
    except hvd.HorovodInternalError:
        pass  # another rank shut down first: this backward failed half-way, as in a real failure
    hvd.shutdown()
    state.restore()
    hvd.init()
    train_step(model, opt, 100 + r)  # zero_grad would refuse if the old handles were still there
    every = hvd.allgather(flat(model.parameters()).unsqueeze(0), name="test.after_reinit")
    assert all(torch.equal(every[0], every[k]) for k in range(n))
    assert opt._handles == {}


class Indices(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def sampler_at(sampler_state, size, rank, monkeypatch, dataset):
    """A sampler with sampler_state, shared out as if the job had `size` ranks and this were `rank`."""
    import kolo.torch.elastic as te
    monkeypatch.setattr(te, "size", lambda: size)
    monkeypatch.setattr(te, "rank", lambda: rank)
    s = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    s.load_state_dict(sampler_state)
    monkeypatch.undo()
    return s


def test_elastic_sampler_shares_out_the_epoch():
    n, r = n_r()
    data = Indices(23)
    s = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    every = everyones(list(s))
    assert all(len(mine) == math.ceil(23 / n) == len(s) for mine in every)
    assert set().union(*map(set, every)) == set(range(23))
    assert sum(map(len, every)) - 23 == n * math.ceil(23 / n) - 23  # the padding, nothing more
    s2 = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    s2.set_epoch(1)
    assert list(s2) != list(s) and s2.processed_indices == set()
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s)
    assert [b.tolist() for b in loader][1] == s.get_indices(1, 4)


@pytest.mark.parametrize("new_size", [1, 2, 5])
def test_elastic_sampler_after_a_size_change_loses_and_repeats_nothing(monkeypatch, new_size):
    n, r = n_r()
    data = Indices(23)
    s = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    s.record_batch(0, 3)
    s.record_batch(1, 3)
    batches = everyones(s.get_indices(0, 3) + s.get_indices(1, 3))
    # every rank recorded every rank's batches: the same record everywhere
    assert everyones(sorted(s.processed_indices)) == [sorted(set().union(*map(set, batches)))] * n
    done = set(s.processed_indices)
    assert len(done) == min(23, 6 * n)
    left = set(range(23)) - done
    shares = [list(sampler_at(s.state_dict(), new_size, k, monkeypatch, data)) for k in range(new_size)]
    got = [i for share in shares for i in share]
    assert set(got) == left and not done & set(got)
    per = math.ceil(len(left) / new_size)
    assert all(len(share) == per for share in shares) and len(got) - len(left) == per * new_size - len(left)


def test_torch_state_saves_syncs_and_resets_a_sampler(monkeypatch):
    n, r = n_r()
    data = Indices(23)
    s = hvd.elastic.ElasticSampler(data, shuffle=False)
    state = hvd.elastic.TorchState(sampler=s, epoch=0)
    assert state.sampler is s
    s.record_indices([r])  # each rank's own record: sync() takes them all
    state.sync()
    assert s.processed_indices == set(range(n))
    assert set().union(*map(set, everyones(list(s)))) == set(range(n, 23))
    state.commit()
    s.record_batch(0, 2)
    s.set_epoch(1)
    state.restore()
    assert s.epoch == 0 and s.processed_indices == set(range(n))
    # after a reset the sampler shares out again with the new size
    import kolo.torch.elastic as te
    monkeypatch.setattr(te, "size", lambda: n + 1)
    monkeypatch.setattr(te, "rank", lambda: r)
    state.on_reset()
    assert s.num_replicas == n + 1 and len(s) == math.ceil((23 - n) / (n + 1))


# ---- standalone: a worker is lost, the others re-form the job ----

LOST_WORKER = r"""
import json, os
import torch
import kolo.torch as hvd
from kolo import elastic

hvd.init()
r0 = hvd.rank()
# Where the survivors meet again: the launcher's part, played here (the test picked the port).
# Old rank 1 serves the new round's rendezvous and becomes its rank 0 (the oldest survivor); old
# rank 2 becomes rank 1.
port = int(os.environ["SECOND_ROUND_PORT"])


def next_round():
    hvd.shutdown()
    r = r0 - 1
    os.environ.update(KOLO_RANK=str(r), KOLO_SIZE="2", KOLO_LOCAL_RANK=str(r), KOLO_LOCAL_SIZE="2",
                      KOLO_RENDEZVOUS="127.0.0.1:%d" % port, KOLO_RENDEZVOUS_SERVER="rank0",
                      KOLO_JOB_ID="second-round-%d" % port)
    hvd.init()


elastic._reset = next_round

data = list(range(40))
torch.manual_seed(10 + r0)  # different weights on every rank: sync() gives them rank 0's
model = torch.nn.Linear(1, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.5),
                               named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(data, seed=7)
loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, seen=[[], []], started=0, finished=0)
resets = []
state.register_reset_callbacks([lambda: resets.append([hvd.rank(), hvd.size()])])


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, 2):
        for i, idx in enumerate(loader):
            state.started += 1  # the survivors' batch that fails is rolled back: started == finished
            x = idx.float().unsqueeze(1) / 40
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), 3 * x).backward()
            opt.step()
            state.seen[state.epoch] += hvd.allgather(idx, name="seen").tolist()
            sampler.record_batch(i, 2)
            if r0 == 0 and state.epoch == 0 and i == 3:
                os._exit(0)  # vanishes in the middle of the epoch, without a goodbye
            state.finished += 1
            state.commit()
        sampler.set_epoch(state.epoch + 1)
    return hvd.size()


size = train(state)
weights = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0),
                        name="weights")
print("RESULT " + json.dumps(dict(old_rank=r0, rank=hvd.rank(), size=size, resets=resets, seen=state.seen,
                                  started=state.started, finished=state.finished,
                                  same_weights=bool(torch.equal(weights[0], weights[1])))), flush=True)
"""


def run_job(tmp_path, script, kolorun_args, timeout=150):
    """Runs script under kolorun (the one of the build that KOLO_LIBRARY names, else the tree's);
    returns its exit code, its output and the JSON of its RESULT lines."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lib = os.environ.get("KOLO_LIBRARY")
    build = os.path.dirname(os.path.dirname(lib)) if lib else os.path.join(ROOT, "build")
    p = subprocess.run([os.path.join(build, "bin", "kolorun")] + kolorun_args + [sys.executable, str(path)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       cwd=str(tmp_path))
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in p.stdout.splitlines() if "RESULT " in line]
    return p.returncode, p.stdout, results


@pytest.mark.standalone
def test_a_lost_worker_and_the_job_goes_on(tmp_path):
    from benchcommon import free_port
    rc, out, found = run_job(tmp_path, LOST_WORKER, ["-np", "3", "-x", "SECOND_ROUND_PORT=%d" % free_port()])
    results = {res["old_rank"]: res for res in found}
    assert rc == 0 and sorted(results) == [1, 2], out
    for old, res in results.items():
        assert (res["rank"], res["size"]) == (old - 1, 2) and res["resets"] == [[old - 1, 2]]
        assert res["same_weights"] and res["started"] == res["finished"] > 0
        # epoch 0: four batches of three ranks, the rest shared out between two; epoch 1 by two.
        # Every sample once: none lost with the worker, none repeated after the rollback.
        for seen in res["seen"]:
            assert sorted(seen) == list(range(40)), seen
    assert results[1]["seen"] == results[2]["seen"]


# ---- standalone, with kolorun's elastic mode: the job grows, the new worker gets the state ----

GROWING = r"""
import json, os, time
import torch
import kolo.torch as hvd

hvd.init()
joined_in = hvd.elastic_round()
data = list(range(40))
torch.manual_seed(10 + hvd.rank() + 10 * joined_in)  # different weights on every worker: sync() gives rank 0's
model = torch.nn.Linear(1, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.5),
                               named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(data, seed=7)
loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, seen=[[], []])
resets = []
state.register_reset_callbacks([lambda: resets.append([hvd.rank(), hvd.size()])])


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, 2):
        for i, idx in enumerate(loader):
            x = idx.float().unsqueeze(1) / 40
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), 3 * x).backward()
            opt.step()
            state.seen[state.epoch] += hvd.allgather(idx, name="seen").tolist()
            sampler.record_batch(i, 2)
            if hvd.rank() == 0 and not os.path.exists("grow"):
                open("grow", "w").close()  # the discovery script lists a third slot from now on
            time.sleep(0.2)  # time for kolorun to notice and to start the third worker
            state.commit()
        sampler.set_epoch(state.epoch + 1)
    return hvd.size()


size = train(state)
weights = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0),
                        name="weights")
print("RESULT " + json.dumps(dict(joined_in=joined_in, rank=hvd.rank(), size=size, round=hvd.elastic_round(),
                                  resets=resets, seen=state.seen,
                                  same_weights=all(torch.equal(weights[0], w) for w in weights))), flush=True)
"""


@pytest.mark.standalone
def test_an_elastic_job_grows_and_the_new_worker_gets_the_state(tmp_path):
    lib = os.environ.get("KOLO_LIBRARY")
    build = os.path.dirname(os.path.dirname(lib)) if lib else os.path.join(ROOT, "build")
    usage = subprocess.run([os.path.join(build, "bin", "kolorun"), "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True).stdout
    if "--max-np" not in usage:
        pytest.skip("this kolorun has no elastic mode")
    hosts = tmp_path / "hosts.sh"
    hosts.write_text("#!/bin/sh\nif [ -e %s ]; then echo localhost:3; else echo localhost:2; fi\n" % (tmp_path / "grow"))
    hosts.chmod(0o755)
    rc, out, found = run_job(tmp_path, GROWING, ["-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts)])
    results = {res["rank"]: res for res in found}
    assert rc == 0 and sorted(results) == [0, 1, 2], out
    assert [results[r]["joined_in"] for r in range(3)] == [1, 1, 2]  # the new worker is the youngest
    for r, res in results.items():
        assert (res["size"], res["round"]) == (3, 2) and res["same_weights"]
        assert res["resets"] == ([[r, 3]] if res["joined_in"] == 1 else [])  # the new worker only synced
        # the first epoch began with two workers and ended with three: every sample, and again only
        # the fewer than 3 that pad the last share-out to a multiple of 3
        for seen in res["seen"]:
            assert set(seen) == set(range(40)) and 0 <= len(seen) - 40 < 3, seen
        assert res["seen"] == results[0]["seen"]


@pytest.mark.standalone
def test_elastic_driver_removes_its_directory_after_the_discoverer_stops(tmp_path, monkeypatch):
    # kolo.ray's and kolo.spark's elastic driver writes the framework's hosts into a file of its
    # directory every second. It removes the directory when kolorun ends, but a write under way
    # then could put a file back while the directory was being removed, and the directory stayed
    # (a kolo-elastic-* holding "hosts" in /tmp after a Ray suite). Here the discoverer is in the
    # middle of a write (the framework slow to answer) when the job ends.
    from kolo import _elastic_driver

    class SlowBackend:
        calls = 0

        def nodes(self):
            if threading.current_thread().name == "kolo elastic discovery":
                SlowBackend.calls += 1
                time.sleep(0.5)
            return {"localhost": 1}

    removed = []
    real_rmtree = _elastic_driver.shutil.rmtree

    def rmtree(path, ignore_errors=False):
        alive = [t.name for t in threading.enumerate() if t.name == "kolo elastic discovery"]
        removed.append((path, alive))
        real_rmtree(path, ignore_errors=ignore_errors)
    monkeypatch.setattr(_elastic_driver.shutil, "rmtree", rmtree)
    job = _elastic_driver.Job(SlowBackend(), 1, 1, 10, 10)
    kolorun = tmp_path / "kolorun"  # a kolorun that lasts until the discoverer is in the framework
    kolorun.write_text("#!/bin/sh\nsleep 1.2\n")
    kolorun.chmod(0o755)
    job.kolorun = str(kolorun)
    assert job.run(b"unused") == []
    assert SlowBackend.calls >= 1
    [(path, alive)] = removed
    assert alive == [], "the directory was removed while the discoverer still wrote into it"
    assert not os.path.exists(path)


@pytest.mark.standalone
def test_elastic_driver_passes_kolorun_output_on_as_it_comes(tmp_path):
    # kolorun shows a worker's progress bar as it is drawn; the driver of kolo.ray's and
    # kolo.spark's elastic jobs copied its output line by line, and so held a bar for an epoch
    from kolo import _elastic_driver

    class Local:
        def nodes(self):
            return {"localhost": 1}

    flag = tmp_path / "seen"

    class Watched(io.StringIO):
        def write(self, text):
            if "step 1" in text:
                flag.touch()
            return super().write(text)

    kolorun = tmp_path / "kolorun"  # a bar's first step, then the next once the driver showed it
    kolorun.write_text("#!/bin/sh\nprintf '[0]<stdout>:\\rstep 1 \\342\\226'\nprintf '\\210'\n"
                       "n=0; while [ ! -e %s ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n+1)); done\n"
                       "printf '\\rstep 2\\n'\n" % flag)
    kolorun.chmod(0o755)
    job = _elastic_driver.Job(Local(), 1, 1, 10, 10)
    job.kolorun = str(kolorun)
    out = Watched()
    t0 = time.monotonic()
    assert job.run(b"unused", stdout=out, stderr=io.StringIO()) == []
    assert out.getvalue() == "[0]<stdout>:\rstep 1 \u2588\rstep 2\n"
    assert time.monotonic() - t0 < 15, "the driver showed the bar's first step only at its end"
