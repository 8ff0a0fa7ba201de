"""The exceptions of Horovod's elastic API, under the names scripts catch them by
(`from horovod.common.exceptions import HorovodInternalError` becomes
`from elasticd.common.exceptions import HorovodInternalError`)."""

from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """A collective failed: a peer was lost or went silent past the communication timeout.
    elastic.run restores the last commit and resets."""


class HostsUpdatedInterrupt(RuntimeError):
    """The hosts changed and every rank agreed on it at the same commit; elastic.run resets
    without restoring (no step is lost)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the job changed")
        self.skip_sync = skip_sync
