"""Worker entry point of ``python -m tcpstore.run``: ``env://`` on tcpstore-server.

    python -m tcpstore._worker [--module] SCRIPT_OR_MODULE [ARGS...]

With $TCPSTORE_RUN_ENDPOINT set (tcpstore.run sets it), init_method "env://"
(torch's default) becomes "tcpstore://$TCPSTORE_RUN_ENDPOINT/<job>" with the
job id of tcpstore.torch (TORCHELASTIC_RUN_ID/attempt_<restart count>), then
the script runs as __main__.
"""

import os
import runpy
import sys
from urllib.parse import urlparse

import tcpstore.torch as tt

ENDPOINT_ENV = "TCPSTORE_RUN_ENDPOINT"


def _env_on_tcpstore(url, timeout=None, **kwargs):
    endpoint = os.environ[ENDPOINT_ENV]
    query = urlparse(url).query
    return tt._tcpstore_rendezvous_handler(
        f"tcpstore://{endpoint}/{tt.job_id_from_env()}" + (f"?{query}" if query else ""),
        timeout=timeout, **kwargs)


def main():
    if os.environ.get(ENDPOINT_ENV):
        tt._rdzv._rendezvous_handlers["env"] = _env_on_tcpstore
    argv = sys.argv[1:]
    as_module = bool(argv) and argv[0] == "--module"
    if as_module:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m tcpstore._worker [--module] SCRIPT [ARGS...]")
    sys.argv = argv
    if as_module:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
