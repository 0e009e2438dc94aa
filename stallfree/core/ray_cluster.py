"""The Ray cluster a process works on, and a quick refusal of an address where nothing listens.

Which cluster: the one the process is connected to, a named one, ``RAY_ADDRESS``, or a new local one. Used by the
Loader's Ray workers and by ingest on Ray alike. A local cluster started here is guarded: its processes end with this
process, however it ends (:mod:`.ray_guardian`). A cluster that refuses this process's auth token (Ray's token
authentication, ``RAY_AUTH_MODE=token``) is named as such, with where this process takes its token from.

``ray`` is imported inside the functions: it is an extra (``stallfree[ray]``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from stallfree.core.ray_guardian import guard, ray_children

__all__ = ["answers", "connect", "require_answer"]

_CONNECT_S = 5.0  # a TCP connect to the cluster's GCS: on a network that answers, well under a second


def _connect_error(address: str) -> OSError | ValueError | None:
    """Why nothing answers a TCP connect at ``HOST:PORT`` (``None``: it answers, or is not of that form)."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit() or "://" in host:
        return None  # "auto", or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_S):
            return None
    except (OSError, ValueError) as err:
        return err


def answers(address: str) -> bool:
    """Whether the cluster's address (its GCS, ``HOST:PORT``) takes a TCP connection."""
    return _connect_error(address) is None


def require_answer(address: str) -> None:
    """Refuse at once a ``HOST:PORT`` where nothing listens (``ray.init`` would try for minutes, then say less).

    Raises:
        ConnectionError: naming the address, why, and how to start a cluster there.
    """
    err = _connect_error(address)
    if err is not None:
        port = address.rpartition(":")[2]
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise ConnectionError(f"no Ray cluster answers at {address} ({why}); start one there (`ray start --head "
                              f"--port={port}`) or pass the address of a running one")


def connect(address: str | None, *, who: str, log_to_driver: bool = False) -> tuple[str, bool]:
    """Connect this process to a cluster; the one it is connected to comes first.

    Else ``address``, else ``RAY_ADDRESS``, else a new local one (as ``ray.init()`` starts it).

    Args:
        address: ``HOST:PORT`` (or ``ray://...``, ``"auto"``), or ``None``.
        who: what asks, for the message when the process is connected to another cluster (``"RayWorkers"``).
        log_to_driver: whether the workers' output is printed here, when this call connects.

    Returns:
        the connected cluster's address, and whether this call connected (the caller then disconnects).

    Raises:
        ValueError: the process is connected to another cluster than ``address``.
        ConnectionError: nothing answers at the address; or Ray could not connect (after its 20 s of tries), saying
            whether the cluster refused this process's auth token and where this process takes its token from.
    """
    import ray

    if ray.is_initialized():
        current = str(ray.get_runtime_context().gcs_address)
        if address is not None and address.removeprefix("ray://") not in ("auto", current):
            raise ValueError(f"{who}(address={address!r}) but this process is connected to the Ray cluster at "
                             f"{current}; leave the address out to use it, or call ray.shutdown() first")
        return current, False
    chosen = address or os.environ.get("RAY_ADDRESS") or None
    if chosen:
        require_answer(chosen)
    before = set() if chosen else ray_children()
    no_token = getattr(ray.exceptions, "AuthenticationError", ())  # Ray >= 2.52, which has token authentication
    try:
        ray.init(address=chosen, include_dashboard=False, log_to_driver=log_to_driver)
    except no_token as err:  # token mode here and no token found: Ray says so at once, naming where to put one
        raise ConnectionError(f"cannot connect to the Ray cluster at {chosen or 'a new local one'}: {err}") from None
    except ConnectionError as err:
        hint = f"; {_token_hint(err)}" if chosen else ""
        raise ConnectionError(f"cannot connect to the Ray cluster at {chosen}: {err}{hint}") from err
    if not chosen:  # a new local cluster (or one this machine runs, joined: then no new process to guard)
        guard(ray_children() - before)
    return str(ray.get_runtime_context().gcs_address), True


def _token_hint(err: BaseException) -> str:
    """What to say of the auth token when connecting failed with ``err`` (Ray says only "Failed to connect")."""
    told = f"{err} {err.__cause__}"
    refused = "InvalidAuthToken" in told or "Unauthenticated" in told
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        sent = "sends no token (RAY_AUTH_MODE is not 'token' here)"
    elif os.environ.get("RAY_AUTH_TOKEN"):
        sent = "sends the token in RAY_AUTH_TOKEN"
    elif os.environ.get("RAY_AUTH_TOKEN_PATH"):
        sent = f"sends the token in the file RAY_AUTH_TOKEN_PATH names ({os.environ['RAY_AUTH_TOKEN_PATH']})"
    else:
        sent = f"sends the token in {Path.home() / '.ray' / 'auth_token'}"
    why = ("the cluster refused this process's auth token" if refused else
           "the address answers, so the cause may be the auth token")
    return (f"{why}: this process {sent}; a cluster started with RAY_AUTH_MODE=token takes RAY_AUTH_MODE=token and "
            "its own token here: in RAY_AUTH_TOKEN, or a file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token "
            "(`ray get-auth-token` on its head node prints it)")
