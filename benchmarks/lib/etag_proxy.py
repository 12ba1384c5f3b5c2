"""A pass-through nginx in front of a Ceph RGW that adds an ETag header where RGW sends none.

Ceph 16.2's RGW (Debian's) answers CompleteMultipartUpload without an ETag header; the AWS connector's client
(mountpoint-s3-client, under s3torchconnector) refuses every multipart save without it ('Header "ETag" not
found'; fixed upstream in Ceph). rlckpt and s3fs do not need the header. The benchmark measures rlckpt through
this proxy and directly, and labels the two destinations apart (`s3-rgw` and `s3-rgw-etag-proxy`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from rlckpt.s3local import free_port

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid nginx.pid;
error_log logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    map $upstream_http_etag $etag_fix {{ "" "\\"00000000000000000000000000000000-1\\""; default $upstream_http_etag; }}
    upstream rgw {{ server {upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;
        location / {{
            proxy_pass http://rgw;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_request_buffering off;
            proxy_buffering off;
            add_header ETag $etag_fix always;
        }}
    }}
}}
"""


class ProxyError(RuntimeError):
    """The proxy cannot run here (no nginx) or did not come up."""


def nginx_conf(upstream: str, port: int) -> str:
    """The proxy's configuration: listen on 127.0.0.1:`port`, pass everything to `upstream` (host:port)."""
    return NGINX_CONF.format(upstream=upstream, port=port)


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint, timeout=2).close()
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 too) means it serves requests
    except OSError:
        return False
    return True


@contextlib.contextmanager
def etag_proxy(endpoint: str, timeout: float = 30.0) -> Iterator[str]:
    """Run the proxy in front of the S3 `endpoint` (http://host:port) for the block; yields its own endpoint.

    Raises:
        ProxyError: nginx is not installed (apt-get install nginx-light), or the proxy did not answer.
    """
    nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if nginx is None:
        raise ProxyError("the RGW ETag proxy needs nginx (apt-get install -y nginx-light)")
    upstream = urlsplit(endpoint).netloc
    prefix = Path(tempfile.mkdtemp(prefix="rlckpt-etag-proxy-"))
    (prefix / "logs").mkdir()
    (prefix / "tmp").mkdir()
    port = free_port()
    (prefix / "nginx.conf").write_text(nginx_conf(upstream, port))
    proc = subprocess.Popen(
        [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    proxied = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _answers(proxied):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (prefix / "logs" / "error.log").read_text() if (prefix / "logs" / "error.log").exists() else ""
                raise ProxyError(f"the ETag proxy on {proxied} did not come up: {log.strip()[-300:]}")
            time.sleep(0.1)
        yield proxied
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(prefix, ignore_errors=True)
