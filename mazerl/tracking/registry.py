"""Register the merged model of every run and move the ``champion`` alias only when it is earned.

Every pipeline run's merged model becomes a new version of the registered model
(``maze-vlm`` by default), tagged with its baseline and final success rates and the run
ids they came from. The alias ``champion`` moves to the new version only when its final
success rate

1. beats the run's own baseline (the training helped),
2. beats the current champion's final success rate (strictly; no champion yet counts as beaten),
3. reaches ``threshold`` (an absolute floor on the final success rate; 0 disables it).

One registered version per trained adapter: a version records the training run it was merged
from and the adapter's digest (:class:`TrainedAdapter`), and a promotion of the same adapter,
from a retry or from another flow run that followed the same training, reuses that version
instead of registering a second one (:func:`version_of_adapter`, :func:`keep_first_version`).
Without an adapter record, a retried promotion reuses the version it already registered for the
same run and source.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow.artifacts
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

from mazerl.tracking.mlflow_model import weights_dir
from mazerl.tracking.store import client_for

DEFAULT_REGISTERED_MODEL = "maze-vlm"
CHAMPION = "champion"
TAG_BASELINE = "mazerl.baseline_success"
TAG_FINAL = "mazerl.final_success"
TAG_RUN = "mazerl.run_id"  # the readable run id, as on the runs (the caller's tags set it)
TAG_DECISION = "mazerl.promotion"
TAG_TRAINED_RUN = "mazerl.trained_run"  # the run directory whose checkpoint was merged
TAG_ADAPTER = "mazerl.adapter_sha256"  # the merged adapter's digest (MergeReport.adapter_sha256)
_LEGAL_NAME = re.compile(r"^[A-Za-z0-9_.\- ]+$")


class RegistryError(ValueError):
    """A registered model name or promotion input that cannot be used."""


@dataclass(frozen=True)
class PromotionDecision:
    """What ``promote`` did and why, in plain values."""

    registered_model: str
    version: str
    promoted: bool
    reason: str  # one sentence, for logs and the Prefect summary
    final_success: float
    baseline_success: float
    previous_champion_version: str | None
    previous_champion_success: float | None
    threshold: float


@dataclass(frozen=True)
class TrainedAdapter:
    """What a merged model was made of: the training run (its run directory's name) and the adapter's digest.

    Two flow runs that followed one training merge the same adapter; this is what says so.
    """

    training_run: str
    adapter_sha256: str

    def tags(self) -> dict[str, str]:
        return {TAG_TRAINED_RUN: self.training_run, TAG_ADAPTER: self.adapter_sha256}


def validate_model_name(name: str) -> str:
    """The name, if it uses only letters, digits, ``_ - .`` and spaces (else a RegistryError with the fix)."""
    if not isinstance(name, str) or not name.strip() or not _LEGAL_NAME.match(name) or name != name.strip():
        bad = sorted({c for c in str(name) if not re.match(r"[A-Za-z0-9_.\- ]", c)})
        detail = f" (illegal characters: {''.join(bad)!r})" if bad else ""
        raise RegistryError(
            f"registered_model={name!r} is not a legal model name{detail}; use letters, digits, '_', '-', '.' and "
            "inner spaces only, e.g. 'maze-vlm'"
        )
    return name


def _check_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or not 0 <= value <= 1:
        raise RegistryError(f"{name}={value!r} must be a success rate between 0 and 1")
    return float(value)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(
                name, description="Merged LoRA policies of the mazerl pipeline; alias 'champion' marks the best."
            )
        except MlflowException as create_exc:  # created by a concurrent promotion in between
            if create_exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def _existing_version(client: MlflowClient, name: str, source: str, run_id: str) -> Any | None:
    for version in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
        if version.source == source:
            return version
    return None


def _versions_of_adapter(client: MlflowClient, name: str, adapter: TrainedAdapter) -> list[Any]:
    wanted = adapter.tags()
    versions = client.search_model_versions(f"name = '{name}'")
    same = [v for v in versions if all(v.tags.get(key) == value for key, value in wanted.items())]
    return sorted(same, key=lambda v: int(v.version))


def version_of_adapter(client: MlflowClient, name: str, adapter: TrainedAdapter) -> Any | None:
    """The version already registered for this trained adapter (the first, if a race made two), or None."""
    same = _versions_of_adapter(client, name, adapter)
    return same[0] if same else None


def keep_first_version(client: MlflowClient, name: str, adapter: TrainedAdapter, created: Any) -> Any:
    """After registering ``created``: if a concurrent promotion registered the same adapter first, delete
    ``created`` and return that one, so that every promotion of one adapter ends on one version."""
    first = version_of_adapter(client, name, adapter)
    if first is None or str(first.version) == str(created.version):
        return created
    client.delete_model_version(name, str(created.version))
    return first


def _current_champion(client: MlflowClient, name: str) -> Any | None:
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def _decide(
    final: float, baseline: float, threshold: float, champion: Any | None, version: str
) -> tuple[bool, str, float | None]:
    """(promote?, the sentence saying why, the champion's recorded final success)."""
    rate = f"final success {final:.3f}"
    if champion is not None and str(champion.version) == version:
        return True, "already the champion (a repeated promotion of the same version)", final
    champion_success: float | None = None
    if champion is not None:
        recorded = champion.tags.get(TAG_FINAL)
        try:
            champion_success = float(recorded) if recorded is not None else None
        except ValueError:
            champion_success = None
        if champion_success is None:
            return (
                False,
                f"not promoted: the current champion (version {champion.version}) has no {TAG_FINAL} tag to compare "
                f"with; set it or move the alias by hand",
                None,
            )
    if final <= baseline:
        return False, f"not promoted: {rate} does not beat this run's baseline {baseline:.3f}", champion_success
    if champion_success is not None and final <= champion_success:
        return (
            False,
            f"not promoted: {rate} does not beat the champion (version {champion.version}, {champion_success:.3f})",
            champion_success,
        )
    if final < threshold:
        return False, f"not promoted: {rate} is below the promotion threshold {threshold:.3f}", champion_success
    versus = (
        f"the champion (version {champion.version}, {champion_success:.3f})" if champion is not None else "no champion"
    )
    return (
        True,
        f"promoted to {CHAMPION}: {rate} beats the baseline {baseline:.3f} and {versus}"
        + (f", and reaches the threshold {threshold:.3f}" if threshold > 0 else ""),
        champion_success,
    )


def _checked_inputs(
    registered_model: str, model_source: str, baseline_success: float, final_success: float, threshold: float
) -> tuple[float, float, float]:
    """(baseline, final, threshold) as floats; a bad name, rate or empty source is refused before the registry is."""
    validate_model_name(registered_model)
    baseline = _check_rate("baseline_success", baseline_success)
    final = _check_rate("final_success", final_success)
    threshold = _check_rate("threshold", threshold)
    if not model_source:
        raise RegistryError(
            "model_source is empty; pass the artifact URI of the merged model (mazerl.tracking.artifacts.artifact_uri)"
        )
    return baseline, final, threshold


def _registered_version(
    client: MlflowClient,
    registered_model: str,
    model_source: str,
    run_id: str,
    version_tags: dict[str, str],
    adapter: TrainedAdapter | None,
    model_id: str | None,
) -> Any:
    """The version to decide on: the adapter's one, else the one this run registered for the source, else a new one."""
    if adapter is not None:
        return register_adapter_once(
            client, registered_model, adapter, model_source, run_id, version_tags, model_id=model_id
        )
    version = _existing_version(client, registered_model, model_source, run_id)
    if version is None:
        return client.create_model_version(
            registered_model, source=model_source, run_id=run_id, tags=version_tags, model_id=model_id
        )
    for key, value in version_tags.items():  # a retried promotion of this run: the version takes its tags
        client.set_model_version_tag(registered_model, version.version, key, value)
    return version


def promote(
    tracking_uri: str,
    registered_model: str,
    model_source: str,
    run_id: str,
    baseline_success: float,
    final_success: float,
    threshold: float = 0.0,
    tags: dict[str, str] | None = None,
    adapter: TrainedAdapter | None = None,
    model_id: str | None = None,
) -> PromotionDecision:
    """Register ``model_source`` (the merged model's artifact URI) as a new version and maybe move ``champion``.

    ``run_id`` is the run the version is registered under, its *Source run* in the UI: the
    pipeline's parent run, whose page then lists the version under *Registered models* and
    whose description tells the run's story. ``model_id`` links the version to the MLflow 3
    logged model whose artifacts ``model_source`` holds. ``tags`` adds version tags such as
    the readable run id and the stage run ids. With ``adapter``, a version already registered
    for that trained adapter is reused (one version per adapter).
    """
    baseline, final, threshold = _checked_inputs(
        registered_model, model_source, baseline_success, final_success, threshold
    )
    client = client_for(tracking_uri)
    _ensure_registered_model(client, registered_model)
    version_tags = {
        TAG_BASELINE: f"{baseline:.6f}",
        TAG_FINAL: f"{final:.6f}",
        **{str(k): str(v) for k, v in (tags or {}).items()},
    }
    version = _registered_version(client, registered_model, model_source, run_id, version_tags, adapter, model_id)
    champion = _current_champion(client, registered_model)
    number = str(version.version)  # the SQL store returns ints, the REST store strings
    promoted, reason, champion_success = _decide(final, baseline, threshold, champion, number)
    if promoted:
        client.set_registered_model_alias(registered_model, CHAMPION, number)
    client.set_model_version_tag(registered_model, number, TAG_DECISION, reason)
    previous = champion if champion is not None and str(champion.version) != number else None
    return PromotionDecision(
        registered_model=registered_model,
        version=number,
        promoted=promoted,
        reason=f"{registered_model} version {version.version}: {reason}",
        final_success=final,
        baseline_success=baseline,
        previous_champion_version=str(previous.version) if previous is not None else None,
        previous_champion_success=champion_success if previous is not None else None,
        threshold=threshold,
    )


def register_adapter_once(
    client: MlflowClient,
    name: str,
    adapter: TrainedAdapter,
    model_source: str,
    run_id: str,
    tags: dict[str, str],
    model_id: str | None = None,
) -> Any:
    """The one version of ``adapter``: the one registered before (its tags kept: the first run that got
    there describes it), else a new one, unless a concurrent promotion of the same adapter won the race."""
    version = version_of_adapter(client, name, adapter)
    if version is not None:
        return version
    created = client.create_model_version(
        name, source=model_source, run_id=run_id, tags=tags | adapter.tags(), model_id=model_id
    )
    return keep_first_version(client, name, adapter, created)


def describe_version(
    tracking_uri: str, registered_model: str, version: str, description: str, *, model_id: str | None = None
) -> None:
    """Give a registered version its description (Markdown: the registry page shows it) and, with
    ``model_id``, list the version on its logged model, as MLflow's tracking server does when it
    registers one (the SQL store registers without it)."""
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    client.update_model_version(registered_model, version, description=description)
    if model_id is None:
        return
    entry = {"name": registered_model, "version": str(version)}
    listed = client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS)
    versions = json.loads(listed) if listed else []
    if (registered_model, str(version)) not in {(v.get("name"), str(v.get("version"))) for v in versions}:
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*versions, entry])})


def model_version_dir(
    tracking_uri: str, registered_model: str, version: str = CHAMPION, dst_dir: str | None = None
) -> str:
    """A local model directory for a registered version (a number such as ``"3"`` or an alias such as ``"champion"``).

    A version is an MLflow transformers model (``mazerl.tracking.mlflow_model``): its ``model/``
    directory, or the shared-storage directory it names for large models; older versions (a
    plain model directory, or a ``pointer.json``) resolve too. A local artifact store resolves
    to the artifact directory itself; a remote one is downloaded into ``dst_dir`` (a temporary
    directory if None).
    """
    validate_model_name(registered_model)
    client = client_for(tracking_uri)
    try:
        entry = (
            client.get_model_version(registered_model, version)
            if str(version).isdigit()
            else client.get_model_version_by_alias(registered_model, version)
        )
    except MlflowException as exc:
        raise RegistryError(
            f"registered model {registered_model!r} has no version or alias {version!r} ({exc.message}); "
            "list them in the MLflow UI under Models"
        ) from exc
    source = entry.source
    local = Path(source.removeprefix("file://")) if "://" not in source or source.startswith("file://") else None
    if local is None or not local.exists():
        local = Path(
            mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=dst_dir, tracking_uri=tracking_uri)
        )
    pointer = local / "pointer.json"
    target = weights_dir(local) or (Path(json.loads(pointer.read_text())["path"]) if pointer.is_file() else local)
    if not (target / "config.json").is_file():
        raise RegistryError(
            f"{registered_model} version {entry.version} points to {target}, which holds no model; "
            "the shared storage was cleaned or is not mounted here"
        )
    return str(target)
