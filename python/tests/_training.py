"""A small PyTorch training run for the suites whose ranks are tasks of another framework
(test_spark.py, test_ray.py): each rank starts from different weights, the broadcast and
DistributedOptimizer must keep them equal. The suites send it by value (their executors
cannot import this directory)."""


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
