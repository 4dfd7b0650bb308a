"""The few Kubernetes API calls the webhook and the extender make, asynchronously over one
kept-alive session."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import msgspec

from runtime_hook.contract import CredentialsError, api_client, in_cluster
from webhook.errors import WebhookError

MERGE_PATCH = "application/merge-patch+json"
_TOKEN_REREAD = 60.0  # seconds: projected service account tokens are rotated on disk
# Where the kubelet puts a pod's service account credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeError(WebhookError, RuntimeError):
    """The API answered an error (``status`` 0: it could not be reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Credentials:
    """Where the API is and how to prove who we are: URL, CA, bearer token or client cert."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None, token: str | None = None,
                 token_file: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.ssl_context = ssl_context
        self._token = token
        self._token_file = token_file
        self._token_read = 0.0

    @classmethod
    def load(cls, kubeconfig: str | None) -> Credentials:
        """From ``kubeconfig``, else the pod's service account; raise KubeError if neither works."""
        if in_cluster(kubeconfig):
            return cls.in_cluster()
        try:
            configuration = api_client(kubeconfig).configuration
        except CredentialsError as exc:
            raise KubeError(0, str(exc)) from None
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        keys = configuration.api_key or {}  # the key's name differs between client versions
        token = (keys.get("BearerToken") or keys.get("authorization") or "").removeprefix(
            "Bearer ")
        return cls(configuration.host, context, token or None)

    @classmethod
    def in_cluster(cls, account_dir: str = SERVICE_ACCOUNT_DIR) -> Credentials:
        """The pod's service account and the API's Service address, as the kubelet gives them.

        The same files the ``kubernetes`` client reads in a pod, read here without it:
        importing it costs a server about 21 MiB, and the webhook reads Nodes by default.
        """
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token_file = os.path.join(account_dir, "token")
        try:
            context = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))
            with open(token_file, encoding="utf-8") as source:
                token = source.read().strip()
        except OSError as exc:
            raise KubeError(0, f"no Kubernetes credentials: {exc.filename}: {exc.strerror} "
                               "(is the service account token mounted?)") from None
        if not host:
            raise KubeError(0, "no Kubernetes credentials: KUBERNETES_SERVICE_HOST is not set")
        address = f"[{host}]" if ":" in host else host
        credentials = cls(f"https://{address}:{port}", context, token, token_file)
        credentials._token_read = time.monotonic()
        return credentials

    def header(self) -> dict[str, str]:
        if self._token_file and time.monotonic() - self._token_read > _TOKEN_REREAD:
            try:
                with open(self._token_file, encoding="utf-8") as source:
                    self._token = source.read().strip()
                self._token_read = time.monotonic()
            except OSError:
                pass  # keep the token read last; the API says 401 if it has expired
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}


class Kube:
    """GET, PATCH and POST of JSON objects; errors become KubeError with the API's message."""

    def __init__(self, credentials: Credentials, connections: int = 32) -> None:
        self._credentials = credentials
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections,
                                           ssl=credentials.ssl_context or True),
            timeout=aiohttp.ClientTimeout(total=10))

    async def close(self) -> None:
        await self._session.close()

    async def get(self, path: str, accept: str | None = None) -> dict[str, Any]:
        """GET ``path`` (with its query); ``accept`` asks for another form of the answer."""
        return _decoded(await self.read(path, accept))

    async def read(self, path: str, accept: str | None = None) -> bytes:
        """GET ``path`` as :meth:`get` does, its answer left as it came: for a caller that
        decodes it into types of its own."""
        return await self._call("GET", path, None, None, accept)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _decoded(await self._call("PATCH", path, body, MERGE_PATCH))

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _decoded(await self._call("POST", path, body, "application/json"))

    async def delete(self, path: str) -> dict[str, Any]:
        return _decoded(await self._call("DELETE", path, None, None))

    async def lines(self, path: str, accept: str | None = None,
                    idle: float = 60.0) -> AsyncGenerator[bytes, None]:
        """GET ``path`` and yield its answer line by line as it comes (a watch); raise
        KubeError if the API refuses it, cannot be reached, or sends nothing for ``idle``
        seconds."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=idle)
        try:
            async with self._session.get(self._credentials.url + path,
                                         headers=self._headers(accept),
                                         timeout=timeout) as answer:
                if answer.status >= 300:
                    _check("GET", path, answer.status, await answer.read())
                pending = b""
                async for chunk in answer.content.iter_any():
                    *complete, pending = (pending + chunk).split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield line
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable("GET", path, exc) from None

    def _headers(self, accept: str | None) -> dict[str, str]:
        headers = self._credentials.header()
        if accept:
            headers["Accept"] = accept
        return headers

    async def _call(self, method: str, path: str, body: dict[str, Any] | None,
                    content_type: str | None, accept: str | None = None) -> bytes:
        headers = self._headers(accept)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = msgspec.json.encode(body)
        try:
            async with self._session.request(method, self._credentials.url + path,
                                             data=data, headers=headers) as answer:
                payload = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(method, path, exc) from None
        _check(method, path, status, payload)
        return payload


def _decoded(payload: bytes) -> dict[str, Any]:
    """An answer as JSON; {} when it is empty or not JSON."""
    try:
        return msgspec.json.decode(payload) if payload else {}
    except msgspec.DecodeError:
        return {}


def _check(method: str, path: str, status: int, payload: bytes) -> None:
    """Raise KubeError for an answer that is not a success."""
    if status >= 300:
        raise KubeError(status, _message(payload) or f"HTTP {status} from {method} {path}")


def _unreachable(method: str, path: str, exc: BaseException) -> KubeError:
    return KubeError(0, f"cannot reach the API server ({method} {path}): "
                        f"{exc or type(exc).__name__}")


def _message(payload: bytes) -> str | None:
    """The message of an error answer (a Status object), if it has one."""
    result = _decoded(payload)
    message = result.get("message") if isinstance(result, dict) else None
    return message if isinstance(message, str) else None
