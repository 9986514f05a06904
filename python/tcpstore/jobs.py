"""The job key schema and the fail-fast join, over any torch-like store.

Keys (user keys as torch's TCPStore names them; on the wire each gets a
leading '/'), all below the job prefix ``<job>/`` (PrefixStore(job, store)):

  <job>/tcpstore/world_size   "N" (decimal): the job's expected ranks; the
                              first rank to join claims it (compare_set)
  <job>/tcpstore/rank/<r>     "<host> <pid>": rank r has joined (claimed by
                              rank r with compare_set, so a second process
                              claiming rank r of a live job fails at once)
  <job>/tcpstore/joined       counter: ranks joined so far (ADD 1 per rank);
                              the rank that gives up adds -FAILED_OFFSET, so
                              a later arrival sees a negative count in its
                              own ADD and fails at once (no extra read)
  <job>/tcpstore/ready        "1": set by the rank whose ADD made joined == N;
                              every other rank blocks in one WAIT on it
  <job>/tcpstore/failed       one line: why the join failed (first rank to give
                              up writes it, then poisons joined)
  <job>/tcpstore/finished     counter: ranks that ended cleanly (release)

The store handed to torch is PrefixStore(job, store): torch's own keys of the
job (default_pg/..., store_based_barrier_key:...) live under <job>/ as well.

Live job: its world_size key exists. A job id is released when all N ranks
ended cleanly: the last one (finished == N) deletes every key under <job>/
(with tcpstore.Client.list_keys; servers without LIST_KEYS keep the job
claimed). A job that failed or crashed stays claimed: use a new job id, or
`tcpstore-cli release JOB` once no rank of it runs.
"""

import os
import socket
import time
from datetime import timedelta

from .errors import JobConflict, JoinError

NS = "tcpstore/"
WORLD_SIZE = NS + "world_size"
JOINED = NS + "joined"
READY = NS + "ready"
FAILED = NS + "failed"
FINISHED = NS + "finished"
_PROBE = "\x00tcpstore-probe\x00"  # a value no rank writes
FAILED_OFFSET = 1 << 40  # subtracted from joined when the join failed


def joined_count(v):
    """(ranks joined, failed) from the joined counter's value."""
    k = int(v)
    return (k + FAILED_OFFSET, True) if k < 0 else (k, False)


def rank_key(r):
    return f"{NS}rank/{r}"


def _s(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def peek(store, key):
    """The value of key, or None if absent, without blocking or writing
    (compare_set with an expected value no one stores: a missing key returns
    the expected value and stays missing). Works on torch 1.13 and 2.x."""
    v = _s(store.compare_set(key, _PROBE, _PROBE))
    return None if v == _PROBE else v


def registered(store, world_size):
    """{rank: "host pid"} of the ranks whose registration key exists."""
    out = {}
    for r in range(world_size):
        v = peek(store, rank_key(r))
        if v is not None:
            out[r] = v
    return out


def format_ranks(ranks, limit=64):
    ranks = sorted(ranks)
    # ranges: 0-3,7
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    text = ",".join(parts[:limit])
    return text + (",..." if len(parts) > limit else "")


def join(store, job, rank, world_size, deadline, where="", probe_store=None):
    """Registers this rank and returns when all world_size ranks joined.

    store: the job's store (keys as above, e.g. PrefixStore(job, TCPStore)).
    deadline: seconds (or timedelta) for the whole join. Raises JobConflict
    at once if a live job holds this job id, JoinError naming the missing
    ranks when the deadline passes (or when another rank already gave up).
    probe_store: a callable returning a fresh store for the diagnosis after a
    timed-out wait (torch 1.13's client is unusable after one); default store.
    """
    if isinstance(deadline, timedelta):
        deadline = deadline.total_seconds()
    me = f"{socket.gethostname()} {os.getpid()}"
    n = str(int(world_size))
    ws = _s(store.compare_set(WORLD_SIZE, "", n))
    if ws != n:
        raise JobConflict(
            f"tcpstore job '{job}'{where}: world size {n} requested, but a live job with this "
            f"id expects {ws}. Use another job id (tcpstore://HOST:PORT/JOBID, TCPSTORE_JOB_ID "
            f"or TORCHELASTIC_RUN_ID), or `tcpstore-cli release {job}` if that job is gone")
    holder = _s(store.compare_set(rank_key(rank), "", me))
    if holder != me:
        raise JobConflict(
            f"tcpstore job '{job}'{where}: rank {rank} is already registered by '{holder}' "
            f"(host pid): a live job uses this job id. Use another job id (tcpstore://HOST:PORT"
            f"/JOBID, TCPSTORE_JOB_ID or TORCHELASTIC_RUN_ID), or `tcpstore-cli release {job}` "
            "once no rank of it runs")
    count, failed = joined_count(store.add(JOINED, 1))
    if failed:
        why = peek(store, FAILED) or "the join failed"
        raise JoinError(f"tcpstore job '{job}'{where}: rank {rank} joined too late: {why}",
                        job=job)
    if count >= world_size:
        store.set(READY, "1")
        return
    t0 = time.monotonic()
    try:
        store.wait([READY], timedelta(seconds=deadline))
        return
    except Exception as e:  # torch: RuntimeError (1.13) / DistStoreError (2.x)
        if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
            raise
        waited = time.monotonic() - t0
    ps = probe_store() if probe_store else store
    if peek(ps, READY) is not None:  # completed in the race with our deadline
        return
    reg = registered(ps, world_size)
    missing = [r for r in range(world_size) if r not in reg]
    msg = (f"tcpstore job '{job}'{where}: {len(reg)}/{world_size} ranks joined within the "
           f"join deadline of {deadline:g} s (rank {rank} waited {waited:.1f} s); missing "
           f"rank(s): {format_ranks(missing) or 'none (joined after the deadline)'}")
    if _s(ps.compare_set(FAILED, "", msg)) == msg:  # the first one to give up
        ps.add(JOINED, -FAILED_OFFSET)  # later arrivals fail at once in their ADD
    raise JoinError(msg, missing=missing, job=job)


def finish(store, world_size, clear):
    """Counts this rank as ended cleanly; the last one calls clear()."""
    if store.add(FINISHED, 1) >= world_size:
        clear()
