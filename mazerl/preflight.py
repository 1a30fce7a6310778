"""Checks of a pipeline run's inputs that cost milliseconds and write nothing.

The first task of a pipeline run calls :func:`check_pipeline_inputs` before it builds the
starter, starts Ray or opens MLflow runs, so a run with a bad input leaves nothing behind
but its own failed flow run (the error record). What ``PipelineParams`` cannot check
itself, because it is also validated where the files do not exist (a deployment's
parameters, the UI's form), is checked here on the machine that runs the flow:

- ``data_root``: the directory can be created and written by this user (tried, not guessed
  from permission bits: root passes ``os.access`` on ``/proc``), its names fit the file
  system, no control character; an empty ``MAZERL_HOME`` is refused, not read as ``./.mazerl``;
- ``eval_set``: the file loads and its digest verifies against the one pinned in code;
- ``base_model``: a Hugging Face vision-language model directory (config, weights whose
  safetensors headers match their sizes, tokenizer, processor; a Qwen3-VL ``model_type`` and
  architecture), every JSON file, the tokenizer and the chat template parsed, read without
  executing any code from it and without reading the weights. A path that does not exist here
  while the cluster is remote is left to ``verify_cluster``, which looks at it from a worker node;
- no ``base_model``: a starter already in the data root is the shipped one (its digest) or a
  complete local build, before it is reused;
- ``tracking_uri``: the store works, checked for its kind in seconds (the MLflow REST API itself
  for a server, the file and directory for SQLite, the driver and a connection for a database,
  the plugin for a SageMaker ARN); MLflow's own client would retry for minutes;
- ``training.resume='required'``: the run already has a checkpoint to continue.

``mazerl run`` calls the same checks before it starts Prefect or the Ray head, and adds
:func:`check_ray_address` for a cluster address.

Every error is an :class:`InputError` naming the parameter, the value and the fix; retrying
cannot help, so the task does not retry it.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlparse

from envs.evalset import EvalSetError, load
from mazerl import paths
from mazerl.address_forms import DATABASE_SCHEMES, check_ray_address_form, control_character, redacted
from mazerl.cluster.loopback import is_loopback_host
from mazerl.cluster.probe import check_model_dir
from mazerl.starter.record import RECORD_FILE
from mazerl.starter.shipped import SHIPPED_DIGEST, SHIPPED_DIR, SHIPPED_NAME, directory_digest

if TYPE_CHECKING:
    from mazerl.params import PipelineParams

ANSWER_TIMEOUT_S = 5.0  # a server on the network answers /health or /api/version in milliseconds
ANSWER_READ_BYTES = 64 * 1024  # enough of an answer to tell what kind of server sent it
MLFLOW_PROBE = "/api/2.0/mlflow/experiments/get-by-name"  # MLflow's REST API: the call a run makes first
SQLITE_HEADER = b"SQLite format 3\x00"
# JSON files a Hugging Face model directory may hold besides config.json (read by transformers when present).
MODEL_JSON_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
    "chat_template.json",
)


class InputError(ValueError):
    """A pipeline parameter that cannot work; ``field`` is its name (``training.resume`` for nested ones)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_data_root(root: Path, field: str = "data_root") -> None:
    """The directory exists and is writable, or can be created (tried, and nothing is left to find out).

    ``field`` is the name the user gave it by (``data_root``, ``MAZERL_HOME``; ``--out`` for a command's output).
    """
    root = Path(root)
    fix = (
        "choose a directory you can write with data_root (--data-root) or MAZERL_HOME"
        if field in ("data_root", paths.ROOT_ENV_VAR)
        else f"choose a directory you can write for {field}"
    )
    char = control_character(str(root))
    if char:
        raise InputError(field, f"{field}={str(root)!r} holds a control character ({char}); {fix}")
    _check_name_lengths(root, field, fix)
    existing = root
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
    except OSError as exc:  # a directory on the way that this user may not look into
        raise InputError(field, f"{field}={str(root)!r} cannot be reached ({exc.strerror}); {fix}") from None
    if not existing.is_dir():
        raise InputError(
            field, f"{field}={str(root)!r} cannot be created: {existing} is a file, not a directory; {fix}"
        )
    what = "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(field, f"{field}={str(root)!r} {what} by this user (or is read-only); {fix}")
    try:  # the permission bits can pass where creating fails (root on /proc, some network mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".mazerl-probe-", dir=existing))
    except OSError as exc:
        raise InputError(field, f"{field}={str(root)!r} {what} ({exc.strerror}); {fix}") from None


def _check_name_lengths(path: Path, field: str, fix: str) -> None:
    """Every name in ``path`` and the whole of it fit the file system's limits (else a raw ``[Errno 36]`` later)."""
    existing = Path(path.anchor or "/")
    name_max, path_max = 255, 4096  # Linux's; the nearest existing directory's own limits where it says
    for part in path.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            break
        try:
            if not (existing / part).is_dir():
                break
        except OSError:
            break
        existing = existing / part
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        pass
    for part in path.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            raise InputError(
                field,
                f"{field}: the name {part[:40]}... in it is {size} bytes, more than the {name_max} the file system "
                f"under {existing} allows for one name; {fix} (with shorter names)",
            )
    size = len(os.fsencode(str(path)))
    if size > path_max - 512:  # room for what a run writes below it (runs/<id>/checkpoints/global_step_<N>/...)
        raise InputError(
            field,
            f"{field} is {size} bytes long; the file system allows paths of {path_max} bytes and a run writes up to "
            f"about 500 below its data root; {fix} (a shorter path)",
        )


def check_root_env(data_root: str | None) -> str:
    """The name the data root comes by (``data_root`` or ``MAZERL_HOME``); an empty ``MAZERL_HOME`` is refused
    (it would silently mean ``./.mazerl`` in whatever directory each process starts in), and so is a
    ``MAZERL_DATA_ROOT_MODE`` that is not a usable mode.
    """
    try:
        paths.data_root_mode()
    except ValueError as exc:
        raise InputError(paths.DATA_ROOT_MODE_ENV_VAR, str(exc)) from None
    if data_root:
        return "data_root"
    value = os.environ.get(paths.ROOT_ENV_VAR)
    if value is None:
        return "data_root"
    if not value.strip():
        raise InputError(
            paths.ROOT_ENV_VAR,
            f"{paths.ROOT_ENV_VAR} is set but empty ({value!r}); set it to the data root (e.g. export "
            f"{paths.ROOT_ENV_VAR}=$HOME/.mazerl), or unset it (unset {paths.ROOT_ENV_VAR}) for ./.mazerl",
        )
    return paths.ROOT_ENV_VAR


def check_eval_set(name: str) -> None:
    """The named set loads and its stored digest matches its content."""
    try:
        load(name)
    except EvalSetError as exc:
        raise InputError("eval_set", f"eval_set={name!r}: {exc}") from exc


def check_base_model(model_dir: Path, field: str = "base_model") -> None:
    """A loadable vision-language model directory; config files and weight headers are read, no weights, no code.

    ``field`` is the name the user gave it by (``base_model``, or ``--model`` for ``mazerl eval``). Every
    file the directory claims is parsed as what it must be (JSON, the tokenizer, the chat template), so a
    damaged one is named here instead of failing the first eval worker or the training job.
    """
    found = check_model_dir(str(model_dir))
    if "the directory itself" in found["missing"]:
        starter = ", or leave base_model empty for the embedded starter" if field == "base_model" else ""
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} is not a directory; give the Hugging Face model directory "
            f"(config.json, weights, tokenizer, processor){starter}",
        )
    if found["missing"]:
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} lacks {', '.join(found['missing'])}; copy the complete model directory "
            "(model.save_pretrained and processor.save_pretrained write all of it)",
        )
    problem = model_file_problem(Path(model_dir))
    if problem:
        raise InputError(
            field,
            f"{field}={str(model_dir)!r}: {problem}; copy the complete model directory (model.save_pretrained and "
            "processor.save_pretrained write all of it)",
        )
    # lazy: the loader imports torch (seconds), which `mazerl run --help` and the UI's parameter form do not need
    from mazerl.policy.loader import ModelLoadError, check_image_text_to_text

    try:
        check_image_text_to_text(model_dir)
    except ModelLoadError as exc:
        raise InputError(field, f"{field}: {exc}") from exc


def model_file_problem(model_dir: Path) -> str | None:
    """What is wrong with the tokenizer, processor and template files a model directory holds, or None.

    Each is parsed as its loader reads it: the JSON configs as JSON objects, ``tokenizer.json`` by the
    tokenizers library, ``chat_template.jinja`` by Jinja. Milliseconds (a Qwen3-VL tokenizer is 11 MB).
    """
    for name in MODEL_JSON_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return f"{name} does not parse ({_short(exc)})"
        if not isinstance(value, dict):
            return f"{name} holds a JSON {type(value).__name__}, not an object"
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer  # lazy: the Rust tokenizer library, needed only for a model directory

        try:
            Tokenizer.from_file(str(tokenizer))
        except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exceptions for any bad file
            return f"tokenizer.json does not load as a tokenizer ({_short(exc)})"
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # transformers renders templates in this sandbox

        try:
            ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template.read_text())
        except (OSError, ValueError, TemplateError) as exc:
            return f"chat_template.jinja does not parse as a Jinja template ({_short(exc)})"
    return None


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_starter_copy(root: Path) -> None:
    """A starter already under the data root is checked before it is reused.

    A copy of the shipped starter (its ``starter.json`` names the shipped weights) must hash to the
    pinned digest; a starter built here (``mazerl build-starter``: other weights) must be complete
    and parse. A copy cut short (a full disk, a killed copy) or edited would otherwise be found by
    ``verify_cluster`` 40 s in, or fail a stage's job and be retried.
    """
    starter = paths.models_dir(root) / SHIPPED_NAME
    if not starter.exists():
        return  # copied from the shipped data when the run starts
    fix = f"delete {starter} and run again: the shipped starter is copied there afresh"
    record_path = starter / RECORD_FILE
    try:
        record = json.loads(record_path.read_bytes())
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object")
    except FileNotFoundError:
        raise InputError(
            "data_root", f"the starter copy {starter} has no {RECORD_FILE} (an unfinished copy or build); {fix}"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(
            "data_root", f"the starter copy's {record_path} does not parse ({_short(exc)}); {fix}"
        ) from None
    found = check_model_dir(str(starter))
    damage = f"it lacks {', '.join(found['missing'])}" if found["missing"] else model_file_problem(starter)
    if record.get("weights_sha256") == _shipped_weights_digest():
        actual = directory_digest(starter)
        if actual != SHIPPED_DIGEST:
            damage = f"{damage}; " if damage else ""
            raise InputError(
                "data_root",
                f"the starter copy {starter} is not the shipped starter ({damage}its files hash to "
                f"{actual[:12]}..., not the pinned {SHIPPED_DIGEST[:12]}...); {fix}",
            )
    elif damage:
        raise InputError("data_root", f"the starter {starter} cannot be used ({damage}); {fix}")


def _shipped_weights_digest() -> str | None:
    try:
        return json.loads((SHIPPED_DIR / RECORD_FILE).read_bytes()).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None  # the shipped copy's own check (ensure_starter) reports a missing or broken one


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
            return  # MLflow answered: the experiment is there, or is created when the run starts
        message = _short(f"{data.get('error_code')}: {data.get('message', '')}")
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
                f"create it (mkdir -p {directory}) or {fix}",
            )
        try:  # tried, not guessed from permission bits
            fd, probe = tempfile.mkstemp(prefix=".mazerl-probe-", dir=directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise _tracking_error(
                uri, f"the database's directory {directory} is not writable ({exc.strerror})", fix
            ) from None
    if not database.exists():
        return
    if not database.is_file():
        raise _tracking_error(uri, f"{database} is not a file", fix)
    try:
        with open(database, "r+b") as handle:  # SQLite writes the file itself, and a journal beside it
            header = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise _tracking_error(uri, f"{database} cannot be written by this user ({exc.strerror})", fix) from None
    if header and header != SQLITE_HEADER:
        raise _tracking_error(uri, f"{database} is not a SQLite database (it starts with {header[:8]!r})", fix)


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
        name = getattr(exc, "name", None) or _short(exc)
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
        reason = _short(getattr(exc, "orig", None) or exc)
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


def check_ray_address(address: str) -> None:
    """A Ray dashboard (job server) answers at ``address`` (http/https; ``sagemaker_ray://`` is left to Ray)."""
    if urlparse(address).scheme not in ("http", "https"):
        return
    problem = _no_answer(address.rstrip("/") + "/api/version", ray=True)
    if problem:
        raise InputError(
            "ray_address",
            f"ray_address={redacted(address)!r}: the address {problem}; check that the head is running and that the "
            "address is its dashboard (http://<head>:8265), or leave ray_address (--ray-address) empty to start a "
            "local head",
        )


def check_ray_address_form_as(value: str, field: str) -> str:
    """``value`` checked for the form ``ray_address`` has, the error naming ``field`` (a flag)."""
    try:
        return check_ray_address_form(value) or value
    except ValueError as exc:
        raise InputError(field, str(exc).replace("ray_address", field, 1)) from None


RAY_ADDRESS_SCHEMES = ("ray", "http", "https", "sagemaker_ray")  # the address forms Ray's clients parse


def check_ray_address_env() -> str | None:
    """``RAY_ADDRESS`` from the environment, which Ray's clients read when given no address (``mazerl eval``
    connects to it), refused where Ray could not parse it; None when it is not set.

    Ray takes ``auto``, ``local``, a GCS ``host:port``, or an address with one of its schemes; a value
    such as ``garbage`` would otherwise end in Ray's own "Module: garbage does not exist".
    """
    value = os.environ.get("RAY_ADDRESS")
    if value is None or value in ("auto", "local"):
        return value
    fix = (
        "RAY_ADDRESS is set in the environment, where Ray reads it: give a Ray address (auto, <head>:6379, "
        "ray://<head>:10001) or unset it (unset RAY_ADDRESS)"
    )
    char = control_character(value)
    if char:
        raise InputError("RAY_ADDRESS", f"RAY_ADDRESS holds a control character ({char}); {fix}")
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if scheme not in RAY_ADDRESS_SCHEMES:
            raise InputError(
                "RAY_ADDRESS",
                f"RAY_ADDRESS={redacted(value)!r} has the scheme {scheme!r}, which Ray does not know; {fix}",
            )
        try:
            parsed = urlparse(value)
            parsed.port  # noqa: B018 (raises for a port out of range)
        except ValueError as exc:
            raise InputError("RAY_ADDRESS", f"RAY_ADDRESS={redacted(value)!r} does not parse ({exc}); {fix}") from None
        if parsed.username is not None or parsed.password is not None:
            raise InputError(
                "RAY_ADDRESS", f"RAY_ADDRESS={redacted(value)!r} carries credentials (user:password@); {fix}"
            )
        return value
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError("RAY_ADDRESS", f"RAY_ADDRESS={value!r} is not a Ray address (host:port); {fix}")
    return value


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, as much of it as tells what kind of server sent it."""

    status: int
    content_type: str
    body: bytes

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def fetch(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> Answer | str:
    """GET ``url`` within ANSWER_TIMEOUT_S: its answer (any status), or why there was none ("did not answer ...")."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S, context=context) as response:
            return Answer(response.status, response.headers.get_content_type(), response.read(ANSWER_READ_BYTES))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers.get_content_type() if exc.headers else "", exc.read(ANSWER_READ_BYTES))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"did not answer ({getattr(exc, 'reason', exc)}; waited at most {ANSWER_TIMEOUT_S:.0f} s)"


def _no_answer(url: str, ray: bool = False) -> str | None:
    """Why ``url`` did not answer within ANSWER_TIMEOUT_S (a clause "did not answer ..."), or None when it did.

    Any HTTP answer counts (authentication is checked later), except a 404 from a Ray address:
    that is a server that is not a Ray job server, or a network gateway answering for an
    address it cannot route.
    """
    answer = fetch(url)
    if isinstance(answer, str):
        return answer
    if ray and answer.status == 404:
        return f"did not answer as a Ray job server (HTTP 404 for {urlparse(url).path})"
    return None


def model_is_local(ray_address: str | None) -> bool:
    """Whether the cluster shares this machine's files (the embedded head, or a head on localhost)."""
    return ray_address is None or is_loopback_host(urlparse(ray_address).hostname)


def check_resume(checkpoint_dir: Path, resume: str) -> None:
    """``resume='required'`` needs a checkpoint marker in this run's checkpoint directory."""
    from mazerl.training import checkpoints  # lazy: it imports torch (seconds)

    if resume == "required" and checkpoints.read_marker(checkpoint_dir) is None:
        raise InputError(
            "training.resume",
            f"training.resume='required' but {checkpoint_dir} holds no checkpoint (no {checkpoints.MARKER}); "
            "a new flow run starts a new run directory: set training.resume='latest' (the default) to train "
            "from scratch, or retry the failed flow run whose training you want to continue",
        )


def check_pipeline_inputs(params: PipelineParams, run_id: str | None = None) -> None:
    """All of the above for one pipeline run; raises the first :class:`InputError`.

    ``run_id`` None: a run that does not exist yet (``mazerl run`` before it starts its flow run),
    which has no checkpoint to resume.
    """
    root = params.root()
    check_data_root(root, check_root_env(params.data_root))
    check_eval_set(params.resolved_eval_set())
    if params.base_model is not None:
        model_dir = Path(params.base_model).expanduser().resolve()
        if model_dir.exists() or model_is_local(params.ray_address):
            check_base_model(model_dir)
    else:
        check_starter_copy(root)
    check_tracking_uri(params.resolved_tracking_uri(), params.experiment, embedded=params.tracking_uri is None)
    # the run's own config is resolved in ``prepare`` once the model is there; its resume setting
    # and checkpoint directory do not depend on the model
    config = params.train_config(run_id or "new-run", Path(params.base_model or paths.models_dir(root)))
    if run_id is not None:
        check_resume(config.checkpoint_dir, config.resume)
    elif config.resume == "required":
        raise InputError(
            "training.resume",
            "training.resume='required' but a new pipeline run has no checkpoint to continue; set "
            "training.resume='latest' (the default) to train from scratch, or retry the failed flow run whose "
            "training you want to continue (prefect flow-run retry <id>)",
        )
