"""What the suites whose ranks are tasks of another framework (test_spark.py, test_ray.py) run:
a small PyTorch training run (each rank starts from different weights, the broadcast and
DistributedOptimizer must keep them equal), and an elastic loop that loses a worker. The suites
send it by value (their executors cannot import this directory)."""


def train(steps):
    """Trains steps steps on this rank's own data; returns (parameters, losses)."""
    import torch
    import kolo.torch as hvd
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # different starts: the broadcast must make them equal
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return [p.detach().clone() for p in model.parameters()], losses


def elastic_steps(limit, fail_rank, fail=None, on_commit=None):
    """An elastic job's loop of limit allreduce steps, committed every 4; at step 10 of round 1,
    rank fail_rank calls fail() (default: exits with code 3), and the loop goes on in the next
    round with the others. on_commit(step) runs after each commit. Returns the steps done."""
    import os
    import numpy as np
    import kolo
    import kolo.elastic as el
    kolo.init()
    state = el.ObjectState(step=0)

    @el.run
    def loop(state):
        while state.step < limit:
            kolo.allreduce(np.ones(4), name="elastic_steps")
            state.step += 1
            if state.step % 4 == 0:
                state.commit()
                if on_commit is not None:
                    on_commit(state.step)
            if state.step == 10 and kolo.elastic_round() == 1 and kolo.rank() == fail_rank:
                (fail or (lambda: os._exit(3)))()
        return state.step

    return loop(state)
