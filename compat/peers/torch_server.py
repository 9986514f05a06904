#!/usr/bin/env python3
"""A real PyTorch TCPStore server, as a stand-in for tcpstore-server in tests and benchmarks.

Usage (any torch version; run it through run.sh to pick one):
  compat/peers/run.sh 2.6 python3 compat/peers/torch_server.py --port 0
Prints exactly `listening on HOST:PORT` (flushed) once the server accepts connections, then
serves until SIGTERM/SIGINT or until --seconds have passed; exit status 0 in both cases.
Uses the classic backend (use_libuv=False) where the constructor has that parameter.
"""
import argparse
import datetime
import signal
import sys
import threading


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="address printed and dialled by the own client")
    ap.add_argument("--port", type=int, default=0, help="0 = ephemeral")
    ap.add_argument("--seconds", type=float, default=600.0, help="exit after this long")
    ap.add_argument("--timeout", type=float, default=300.0, help="store timeout (s)")
    args = ap.parse_args()

    stop = threading.Event()

    def on_signal(_signo, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import torch.distributed as dist

    kwargs = {"wait_for_workers": False}
    if "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
        kwargs["use_libuv"] = False
    store = dist.TCPStore(args.host, args.port, None, True,
                          datetime.timedelta(seconds=args.timeout), **kwargs)
    print(f"listening on {args.host}:{store.port}", flush=True)
    # Event.wait with a bounded slice so that signals are handled promptly.
    deadline = args.seconds
    step = 0.2
    waited = 0.0
    while not stop.is_set() and waited < deadline:
        stop.wait(step)
        waited += step
    del store
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
