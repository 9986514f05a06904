"""tcpstore: Python client and server launcher for tcpstore (a c10d TCPStore).

Usable without torch. ``import tcpstore.torch`` adds the ``tcpstore://``
init_method to torch.distributed; ``python -m tcpstore.run`` is torchrun on
a tcpstore-server. See python/README.md.
"""

from .client import Client
from .errors import (ConnectionClosed, ConnectionRefused, InvalidArgument, JobConflict,
                     JoinError, LimitExceeded, NotFound, NotSupported, ProtocolError,
                     StoreError, StoreIOError, StoreTimeout)
from .server import Server, ServerError, find_server_binary

__version__ = "0.1.0"

__all__ = [
    "Client", "Server", "ServerError", "find_server_binary", "StoreError", "StoreTimeout",
    "ConnectionRefused", "ConnectionClosed", "StoreIOError", "ProtocolError", "LimitExceeded",
    "InvalidArgument", "NotSupported", "NotFound", "JoinError", "JobConflict",
]
