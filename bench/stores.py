"""Object stores on 127.0.0.1 for the remote benchmark and the tests: S3 (moto) and Cloud Storage.

- :func:`s3_server` starts moto's S3-compatible server (``moto[server]``) and uploads a folder into a bucket.
- :func:`gcs_server` starts gcp-storage-emulator's Cloud Storage server (its JSON API) and uploads a folder.

Each listens on 127.0.0.1 only, on a port the system picks; :func:`s3_options` and :func:`gcs_options` are the
Loader's ``storage_options`` for it (or for a :class:`~stallfree.bench.servers.FaultProxy` in front of it).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["gcs_options", "gcs_server", "s3_options", "s3_server"]


@contextmanager
def s3_server(folder: str | Path | None = None, bucket: str = "data", prefix: str = "ds") -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 (its endpoint URL), with ``folder``'s files uploaded to ``bucket/prefix/``.

    Raises:
        ImportError: moto or boto3 is missing (``pip install 'stallfree[test]'``).
    """
    try:
        import boto3
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server
    except ImportError:
        raise ImportError("the S3 server needs moto[server] and boto3: pip install 'stallfree[test]'") from None

    class S3Only(DomainDispatcherApplication):
        """moto's app for S3 alone.

        moto's server finds the service of every request anew, under one lock: it lists its modules on disk and
        tries some hundred URL patterns. A GET of a 0.5 MB object cost its server 3.5 ms of CPU that way and
        2.2 ms this way (median of 5 x 77 GETs), on the cores the Loader being measured uses.
        """

        def get_application(self, environ: dict[str, Any]) -> Any:
            with self.lock:
                if "s3" not in self.app_instances:
                    self.app_instances["s3"] = self.create_app("s3")
                return self.app_instances["s3"]

    class KeptAlive(MotoRequestHandler):
        protocol_version = "HTTP/1.1"  # werkzeug's default, 1.0, closes the connection after every reply

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request, formatted even when unread
    server = make_server("127.0.0.1", 0, S3Only(create_backend_app), threaded=True, request_handler=KeptAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        if folder is not None:
            for path in sorted(Path(folder).iterdir()):
                if path.is_file():
                    client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def s3_options(endpoint: str) -> dict[str, Any]:
    """The Loader's ``storage_options`` for the server of :func:`s3_server` (or a proxy in front of it)."""
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}


@contextmanager
def gcs_server(folder: str | Path | None = None, bucket: str = "data", prefix: str = "ds") -> Iterator[str]:
    """Start a Cloud Storage server on 127.0.0.1 (its endpoint URL), with ``folder``'s files in ``bucket/prefix/``.

    The server is gcp-storage-emulator's, in memory; the files are uploaded through its JSON API with urllib, not
    with the client under test. gcsfs (from 2026) first asks the gRPC control API for the bucket's layout, which
    the emulator does not serve (a minute's timeout), unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set
    before gcsfs is imported: this sets it in the environment.

    Raises:
        ImportError: gcp-storage-emulator is missing (``pip install 'stallfree[test]'``).
    """
    import os
    import urllib.parse
    import urllib.request

    try:
        from gcp_storage_emulator.server import create_server
    except ImportError:
        raise ImportError("the GCS server needs gcp-storage-emulator: pip install 'stallfree[test]'") from None
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        if folder is not None:
            for path in sorted(Path(folder).iterdir()):
                if path.is_file() and path.stat().st_size:  # the emulator fails on an empty upload (rejected.jsonl)
                    name = urllib.parse.quote(f"{prefix}/{path.name}", safe="")
                    request = urllib.request.Request(
                        f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
                        data=path.read_bytes(), method="POST")
                    urllib.request.urlopen(request, timeout=30).close()
        yield endpoint
    finally:
        server.stop()


def gcs_options(endpoint: str) -> dict[str, Any]:
    """The Loader's ``storage_options`` for the server of :func:`gcs_server` (or a proxy in front of it)."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "test"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
