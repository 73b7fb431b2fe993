"""Exceptions raised by kolo, under Horovod's names (horovod.common.exceptions)."""


class HorovodInternalError(RuntimeError):
    """A collective failed in a way that damages the job: ranks disagreed on a tensor
    (negotiation), a peer was lost or timed out, or kolo was shut down. The message is
    kolo's: it names the tensor, the ranks and the cause."""


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic jobs: kolorun has formed a newer round of the job (workers were added, or only
    removed: skip_sync). Raised on every rank alike by State.commit() and
    State.check_host_updates(); elastic.run() catches it, joins the new round and calls the
    training function again (docs/python.md, "Elastic training")."""

    def __init__(self, skip_sync=False):
        super().__init__("kolorun formed a newer round of the elastic job (%s)" % (
            "workers removed only" if skip_sync else "workers added"))
        self.skip_sync = skip_sync


class KoloWorkerRemovedError(ValueError):
    """init() in a worker of an elastic job that kolorun removed from the job (its host left,
    or the job has enough workers without it). elastic.run() turns it into a clean exit."""


class KoloVersionMismatchError(ImportError):
    """The loaded libkolo is not the version this Python package was written for."""


HorovodVersionMismatchError = KoloVersionMismatchError
KoloInternalError = HorovodInternalError
