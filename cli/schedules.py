"""Check the schedules of ``prefect.yaml`` before ``prefect deploy`` sees them.

Prefect refuses a bad cron string too, but says only "Invalid cron string"; this check names
the deployment and the schedule, and says what a valid one looks like. Run it before deploying::

    python -m cli.schedules            # exit 0: every schedule parses; 2: the first bad one, explained
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"
CRON_HELP = (
    "use five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12) day-of-week (0-6, 0 = Sunday), "
    "e.g. '0 3 * * 1' for Mondays 03:00"
)


def check_schedules(path: str | Path = PREFECT_YAML) -> int:
    """Validate every ``deployments[*].schedules[*]`` with Prefect's own model; returns how many there are."""
    from prefect.client.schemas.schedules import CronSchedule  # Prefect takes seconds to import: only here

    deployments = (yaml.safe_load(Path(path).read_text()) or {}).get("deployments") or []
    count = 0
    for deployment in deployments:
        for index, schedule in enumerate(deployment.get("schedules") or []):
            where = f"deployments[{deployment.get('name')!r}].schedules[{index}]"
            if "cron" not in schedule:
                continue  # interval and rrule schedules: Prefect's messages are clear enough
            try:
                CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone"))
            except ValidationError as exc:
                field = str(exc.errors()[0]["loc"][0])
                fix = CRON_HELP if field == "cron" else "use an IANA time zone name such as UTC or Europe/Berlin"
                raise ValueError(
                    f"{where}.{field} in {path} is {schedule.get(field)!r}, which Prefect cannot parse; {fix}"
                ) from exc
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    path = Path(argv[0]) if argv else PREFECT_YAML
    try:
        count = check_schedules(path)
    except (ValueError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: {count} schedule(s) valid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
