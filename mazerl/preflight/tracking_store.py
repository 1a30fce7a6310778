"""``tracking_uri``: the store works, checked for its kind in seconds (the MLflow REST API itself for a
server, the file and directory for SQLite, the driver and a connection for a database, the plugin for a
SageMaker ARN); MLflow's own client would retry for minutes. The form of the URI is the parameters'
own check (:mod:`mazerl.address_forms`).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shlex
import ssl
import tempfile
from pathlib import Path
from urllib.parse import urlencode, urlparse

from mazerl.address_forms import DATABASE_SCHEMES, redacted
from mazerl.preflight.http_answer import ANSWER_TIMEOUT_S, fetch
from mazerl.preflight.input_error import InputError, short_message

MLFLOW_PROBE = "/api/2.0/mlflow/experiments/get-by-name"  # MLflow's REST API: the call a run makes first
SQLITE_HEADER = b"SQLite format 3\x00"
MIN_MLFLOW_SERVER_MAJOR = 3


def check_tracking_uri(uri: str, experiment: str | None = None, *, embedded: bool = False) -> None:
    """The tracking store ``uri`` names works, checked for its kind in seconds (MLflow's own client would
    retry for minutes, or fail with a traceback).

    - http(s): the MLflow REST API itself answers (a plain web server does not), within seconds, and
      takes this client's credentials (``MLFLOW_TRACKING_TOKEN`` or ``..._USERNAME``/``..._PASSWORD``);
    - sqlite: the file's directory exists (``embedded``: the data root, created by the run), and the
      file, where it exists, is a SQLite database this user can write;
    - a database (postgresql, mysql, mssql): its driver is installed, and the server takes a connection;
    - a SageMaker managed MLflow ARN: the ``sagemaker-mlflow`` plugin, which resolves it, is installed
      (AWS itself cannot be asked before the run's credentials are known; ``verify_cluster`` runs there).

    The form (scheme, host, an absolute sqlite path, the ARN's parts) is the parameters' own check.
    """
    scheme = urlparse(uri).scheme.lower()
    if uri.startswith("arn:"):
        _check_sagemaker_plugin(uri)
    elif scheme in ("http", "https"):
        _check_mlflow_server(uri, experiment or "Default")
    elif scheme == "sqlite":
        _check_sqlite_store(uri, embedded=embedded)
    elif scheme.split("+")[0] in DATABASE_SCHEMES:
        _check_database_store(uri)


def _tracking_error(uri: str, problem: str, fix: str) -> InputError:
    return InputError("tracking_uri", f"tracking_uri={redacted(uri)!r}: {problem}; {fix}")


def _check_mlflow_server(uri: str, experiment: str) -> None:
    start = (
        "start it (e.g. mlflow server --host 127.0.0.1 --port 5000), correct tracking_uri (--tracking-uri), or leave "
        "it empty for the embedded store under the data root"
    )
    url = f"{uri.rstrip('/')}{MLFLOW_PROBE}?{urlencode({'experiment_name': experiment})}"
    answer = fetch(url, headers=mlflow_auth_headers(), context=mlflow_tls_context())
    if isinstance(answer, str):
        raise _tracking_error(uri, f"the MLflow server {answer}", start)
    if answer.status in (401, 403) and os.environ.get("MLFLOW_TRACKING_AUTH"):
        return  # an MLflow auth plugin signs MLflow's own requests; this probe cannot, so MLflow is left to say
    if answer.status in (401, 403):
        raise _tracking_error(
            uri,
            f"the MLflow server refused this client (HTTP {answer.status} for {MLFLOW_PROBE})",
            "set its credentials in the environment: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
            "MLFLOW_TRACKING_TOKEN (and name them in MAZERL_JOB_ENV for the training jobs)",
        )
    data = answer.json()
    if isinstance(data, dict) and ("experiment" in data or "error_code" in data):
        if answer.status == 200 or data.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
            _check_mlflow_version(uri)
            return  # MLflow answered: the experiment is there, or is created when the run starts
        message = short_message(f"{data.get('error_code')}: {data.get('message', '')}")
        raise _tracking_error(
            uri,
            f"the MLflow server answered HTTP {answer.status} ({message})",
            "fix the server (its log says why), or use another tracking_uri",
        )
    raise _tracking_error(
        uri,
        f"the address answered, but not as an MLflow tracking server (HTTP {answer.status}, {answer.content_type} "
        f"for {MLFLOW_PROBE})",
        "give the MLflow server's own address and port (mlflow server prints it, e.g. http://127.0.0.1:5000), or "
        "leave tracking_uri empty for the embedded store",
    )


def _check_mlflow_version(uri: str) -> None:
    """The server is MLflow 3 or newer: the merge stage logs the model with MLflow 3's logged-model API,
    which an MLflow 2 server lacks, and it would fail there only after the GPU hours of training.
    A server that does not say its version (``/version``, which every MLflow server has) is let through."""
    answer = fetch(f"{uri.rstrip('/')}/version", headers=mlflow_auth_headers(), context=mlflow_tls_context())
    if isinstance(answer, str) or answer.status != 200:
        return
    version = answer.body.decode(errors="replace").strip()
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) < MIN_MLFLOW_SERVER_MAJOR:
        raise _tracking_error(
            uri,
            f"the MLflow server is version {version}, and the run needs MLflow >= {MIN_MLFLOW_SERVER_MAJOR} (the merge "
            "logs the model with MLflow 3's logged-model API)",
            "upgrade the server (pip install 'mlflow>=3' where it runs, then restart it), or leave tracking_uri empty "
            "for the embedded store",
        )


def mlflow_auth_headers() -> dict[str, str]:
    """The headers MLflow's own client sends for the credentials in the environment."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def mlflow_tls_context() -> ssl.SSLContext | None:
    """TLS as MLflow's client sets it up from the environment (insecure, a CA bundle, a client certificate)."""
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()  # noqa: S323 - what the user asked MLflow for
    ca = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
    client = os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH")
    if not ca and not client:
        return None
    context = ssl.create_default_context(cafile=ca or None)
    if client:
        context.load_cert_chain(client)
    return context


def _check_sqlite_store(uri: str, *, embedded: bool) -> None:
    database = Path(uri[len("sqlite:///") :]).expanduser()
    fix = (
        "give a sqlite path in an existing directory you can write, or leave tracking_uri empty for the embedded store"
    )
    if not embedded:
        directory = database.parent
        if not directory.is_dir():
            raise _tracking_error(
                uri,
                f"the database's directory {directory} does not exist",
                f"create it (mkdir -p {shlex.quote(str(directory))}) or {fix}",
            )
        try:  # tried, not guessed from permission bits
            fd, probe = tempfile.mkstemp(prefix=".mazerl-probe-", dir=directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise _tracking_error(
                uri, f"the database's directory {directory} is not writable ({exc.strerror})", fix
            ) from None
    problem = sqlite_file_problem(database) if database.exists() else None
    if problem:
        raise _tracking_error(uri, problem, fix)


def sqlite_file_problem(database: Path) -> str | None:
    """Why ``database`` is not a SQLite database file this user can write, or None (an empty file is a new
    database to SQLite). From its first 16 bytes: MLflow would end in a traceback on it."""
    if not database.is_file():
        return f"{database} is not a file"
    try:
        with open(database, "r+b") as handle:  # SQLite writes the file itself, and a journal beside it
            header = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        return f"{database} cannot be written by this user ({exc.strerror})"
    if header and header != SQLITE_HEADER:
        return f"{database} is not a SQLite database (it starts with {header[:8]!r})"
    return None


def _check_database_store(uri: str) -> None:
    """The SQLAlchemy driver of a database URI is installed, and the server takes a connection within seconds."""
    # lazy: SQLAlchemy (MLflow's dependency) takes a moment to import, and only database URIs need it
    from sqlalchemy import create_engine
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import make_url

    try:
        url = make_url(uri)
        dialect = url.get_dialect()
        dialect.import_dbapi()
    except (ImportError, sa_exc.NoSuchModuleError, sa_exc.ArgumentError) as exc:
        name = getattr(exc, "name", None) or short_message(exc)
        raise _tracking_error(
            uri,
            f"the database driver for {urlparse(uri).scheme!r} is not installed (no module {name!r})",
            "install the package that provides it beside mazerl, or name an installed driver in the scheme "
            "(e.g. postgresql+psycopg2://, mysql+pymysql://)",
        ) from None
    timeout = {"pyodbc": "timeout"}.get(dialect.driver, "connect_timeout")
    engine = create_engine(url, connect_args={timeout: int(ANSWER_TIMEOUT_S)})
    try:
        with engine.connect():
            pass
    except sa_exc.SQLAlchemyError as exc:
        reason = short_message(getattr(exc, "orig", None) or exc)
        if url.password:  # no driver is known to echo it; make sure
            reason = reason.replace(url.password, "***")
        raise _tracking_error(
            uri,
            f"the database did not take a connection ({reason}; waited at most {ANSWER_TIMEOUT_S:.0f} s)",
            "check that the server runs and the URI's host, port, database and user are right",
        ) from None
    finally:
        engine.dispose()


def _check_sagemaker_plugin(uri: str) -> None:
    if importlib.util.find_spec("sagemaker_mlflow") is None:
        raise _tracking_error(
            uri,
            "a SageMaker managed MLflow ARN needs the sagemaker-mlflow plugin, which is not installed",
            "install it with pip install 'mazerl[cluster]' (the cluster image has it), or use another tracking_uri",
        )
