"""Exceptions raised by kolo, under Horovod's names (horovod.common.exceptions)."""


class HorovodInternalError(RuntimeError):
    """A collective failed in a way that damages the job: ranks disagreed on a tensor
    (negotiation), a peer was lost or timed out, or kolo was shut down. The message is
    kolo's: it names the tensor, the ranks and the cause."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode interrupt. kolo has no elastic mode; the class exists so that
    scripts that catch it still import."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync


class KoloVersionMismatchError(ImportError):
    """The loaded libkolo is not the version this Python package was written for."""


HorovodVersionMismatchError = KoloVersionMismatchError
KoloInternalError = HorovodInternalError
