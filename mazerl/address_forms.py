"""The form of the addresses a run is given (an MLflow tracking URI, a Ray address, a SageMaker
ARN), and how messages show what a user typed (control characters named, credentials redacted).

Checked without the network and without files, so :class:`~mazerl.params.PipelineParams` can
check them wherever it is validated (a deployment's parameters, the UI's form); the preflight
(:mod:`mazerl.preflight`) asks the addresses for an answer on the machine where the run starts.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import ParseResult, urlparse

# What a tracking URI may be, in the words every refusal of one ends with.
TRACKING_URI_FORMS = (
    "use an MLflow server (http(s)://host:port), sqlite:////absolute/path/mlflow.db, a database "
    "(postgresql://, mysql:// or mssql://host/db), a SageMaker managed MLflow ARN "
    "(arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>), or leave it empty for the embedded store"
)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")  # MLflow's SQL stores besides SQLite (scheme or scheme+driver)
# SageMaker's own patterns: a region (us-east-1, us-gov-west-1), a 12-digit account, a tracking server name
# (CreateMlflowTrackingServer's TrackingServerName).
ARN_PARTITIONS = ("aws", "aws-us-gov")  # the partitions the sagemaker-mlflow plugin resolves
AWS_REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-[0-9]+")
AWS_ACCOUNT = re.compile(r"[0-9]{12}")
ASSUME_ROLE_VAR = "SAGEMAKER_MLFLOW_ASSUME_ROLE_ARN"  # the role the sagemaker-mlflow plugin assumes, if set
TRACKING_SERVER_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}")


def control_character(value: str) -> str | None:
    """The first control character in ``value`` (NUL, newline, tab, ...), as repr shows it, or None."""
    found = next((char for char in value if unicodedata.category(char) == "Cc"), None)
    return None if found is None else repr(found)


def redacted(address: str) -> str:
    """``address`` as messages may show it: a ``user:password@`` part becomes ``***@``."""
    head, sep, rest = address.partition("://")
    if not sep:
        return address
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{head}{sep}{netloc}{slash}{path}"


def _parsed_url(value: str, field: str, fix: str) -> ParseResult:
    """``value`` parsed, its host and port read (urlparse defers those errors); a ValueError names ``field``."""
    try:
        parsed = urlparse(value)
        parsed.port  # noqa: B018 (raises for a port out of range or not a number)
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise ValueError(f"{field} {redacted(value)!r} is not a valid address ({exc}); {fix}") from None
    return parsed


def check_sagemaker_arn(value: str) -> str:
    """A SageMaker managed MLflow tracking server's ARN, checked part by part so an error names the rule."""
    parts = value.split(":", 5)
    form = "arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>"
    problem = None
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sagemaker":
        problem = f"a SageMaker managed MLflow ARN has the form {form}"
    elif parts[1] not in ARN_PARTITIONS:
        problem = f"its partition {parts[1]!r} is not one of {list(ARN_PARTITIONS)}"
    elif not AWS_REGION.fullmatch(parts[3]):
        problem = f"its region {parts[3]!r} is not an AWS region such as us-east-1"
    elif not AWS_ACCOUNT.fullmatch(parts[4]):
        problem = f"its account {parts[4]!r} is not a 12-digit AWS account id"
    else:
        kind, _, name = parts[5].partition("/")
        resource, _, suffix = parts[5].partition("#")
        if suffix:
            problem = (
                f"it carries {'#' + suffix!r} after {resource!r}, which the sagemaker-mlflow plugin does not take (it "
                "would send the whole text as the server's ARN and assume no role); give the ARN alone, and a role to "
                f"assume in {ASSUME_ROLE_VAR}=arn:aws:iam::<account>:role/<name>, which the plugin reads"
            )
        elif kind != "mlflow-tracking-server":
            problem = f"its resource {kind!r} is not mlflow-tracking-server/<name>"
        elif not TRACKING_SERVER_NAME.fullmatch(name):
            problem = (
                f"its tracking server name {name!r} is not a SageMaker tracking server name (1-256 letters, "
                "digits and hyphens, starting and ending with a letter or digit)"
            )
    if problem:
        raise ValueError(
            f"tracking_uri {value!r} is not a SageMaker managed MLflow ARN: {problem}; copy the ARN "
            "(aws sagemaker describe-mlflow-tracking-server --tracking-server-name <name> --query TrackingServerArn)"
        )
    return value


def check_tracking_uri_form(value: str | None) -> str | None:
    """The form of a tracking URI (no network, no files: the preflight checks those where the run starts)."""
    if value is None:
        return value
    char = control_character(value)
    if char:
        raise ValueError(f"tracking_uri holds a control character ({char}); {TRACKING_URI_FORMS}")
    if value.startswith("arn:"):
        return check_sagemaker_arn(value)
    parsed = _parsed_url(value, "tracking_uri", TRACKING_URI_FORMS)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        if not parsed.hostname:
            raise ValueError(f"tracking_uri {redacted(value)!r} names no host; {TRACKING_URI_FORMS}")
        if parsed.username is not None or parsed.password is not None:
            raise ValueError(
                f"tracking_uri {redacted(value)!r} carries credentials (user:password@), which would be written "
                "into the run's config and logs; give the address alone and set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment, and name them in "
                "MAZERL_JOB_ENV for the training jobs"
            )
        return value
    if scheme == "sqlite":
        path = value[len("sqlite://") :]
        if path in ("", "/") or path.startswith("/:memory:") or not path.startswith("/"):
            raise ValueError(
                f"tracking_uri {value!r} names no database file; use sqlite:////absolute/path/mlflow.db (four "
                "slashes before an absolute path), or leave it empty for the embedded store"
            )
        if not path.startswith("//"):
            raise ValueError(
                f"tracking_uri {value!r} names a relative path ({path[1:]!r}), which every process (the flow, "
                "each Ray job) would look for in its own working directory; give an absolute path: "
                f"sqlite:///{Path(path[1:]).absolute()}"
            )
        return value
    if scheme.split("+")[0] in DATABASE_SCHEMES:
        if not parsed.hostname:
            raise ValueError(f"tracking_uri {redacted(value)!r} names no database host; {TRACKING_URI_FORMS}")
        return value
    if scheme == "file" or value.startswith(("/", ".", "~")):
        raise ValueError(
            f"tracking_uri {value!r} is an MLflow file store, which MLflow 3 refuses (maintenance mode); use "
            "sqlite:////absolute/path/mlflow.db (`mlflow migrate-filestore` moves an existing store), an MLflow "
            "server, or leave it empty for the embedded store"
        )
    if scheme.startswith("databricks"):
        raise ValueError(
            f"tracking_uri {value!r}: Databricks is not supported by mazerl (its registry aliases and artifact "
            f"locations were never tried); {TRACKING_URI_FORMS}"
        )
    raise ValueError(f"tracking_uri {redacted(value)!r} is not a tracking URI; {TRACKING_URI_FORMS}")


def check_ray_address_form(value: str | None) -> str | None:
    """The form of a Ray address (the preflight asks it for an answer where the run starts)."""
    if value is None:
        return value
    fix = (
        "give the dashboard's job server, e.g. http://<head>:8265, or sagemaker_ray://<cluster>/<namespace>; leave "
        "it empty to start a local Ray instance"
    )
    char = control_character(value)
    if char:
        raise ValueError(f"ray_address holds a control character ({char}); {fix}")
    parsed = _parsed_url(value, "ray_address", fix)
    if parsed.username is not None or parsed.password is not None:
        raise ValueError(
            f"ray_address {redacted(value)!r} carries credentials (user:password@), which Ray's job server does "
            "not take; give the address alone, and the cluster's token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        )
    if not re.match(r"^(https?|sagemaker_ray)://[^\s/]+", value) or not parsed.hostname:
        raise ValueError(
            f"ray_address {value!r} must look like http://host:8265 (the dashboard's job server) or "
            "sagemaker_ray://<cluster>/<namespace>; leave it empty to start a local Ray instance"
        )
    return value
