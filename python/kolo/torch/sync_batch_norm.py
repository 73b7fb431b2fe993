"""SyncBatchNorm: batch normalisation whose statistics cover the batch of every rank
(Horovod's hvd.SyncBatchNorm), for models trained with small per-worker batches.

In training, the mean and the variance come from two allreduces (sum and count, then the sum of
squared deviations), which are differentiable (kolo.torch.allreduce's gradient is the allreduce
of the gradient), so backward is correct for the loss summed over the ranks. Every rank must run
the layer the same number of times in the same order (its allreduces are unnamed). In eval mode,
or with one worker, it is plain batch normalisation.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from kolo.basics import Sum, size
from kolo.torch.mpi_ops import allreduce


class SyncBatchNorm(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)

        if self.momentum is None:
            factor = None  # cumulative average, as torch's BatchNorm
        else:
            factor = self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if factor is None:
                factor = 1.0 / float(self.num_batches_tracked)

        c = input.size(1)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, c] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() // c], dtype=input.dtype)
        s = allreduce(torch.cat([input.sum(dims), count]), op=Sum)
        n = s[c]
        mean = s[:c] / n
        centered = input - mean.view(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum) / n  # biased, as used to normalise
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(unbiased.detach() * factor)
        out = centered / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
