"""The eval stage: Wilson intervals, summaries, files, and worker-count independence over real local Ray."""

import json
from dataclasses import replace

import pytest

from mazerl.evaluation.evaluate import EvalReport, evaluate
from mazerl.evaluation.settings import EvalSettings
from mazerl.evaluation.summary import summarize, wilson_interval


@pytest.mark.parametrize(("successes", "n"), [(0, 10), (5, 10), (10, 10), (112, 256), (1, 1), (3, 64)])
def test_wilson_interval_matches_scipy(successes, n):
    from scipy.stats import binomtest

    reference = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    got = wilson_interval(successes, n)
    assert got == pytest.approx((reference.low, reference.high), abs=1e-9), f"Wilson({successes}/{n})"


def test_wilson_interval_of_zero_of_ten_is_known_value():
    # z^2 / (n + z^2) with z = 1.96: the textbook upper bound for no successes
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)


@pytest.mark.parametrize(("successes", "n"), [(-1, 5), (6, 5), (1, -1)])
def test_wilson_interval_refuses_impossible_counts(successes, n):
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(successes, n)


def row(solved, moves, optimal, parse_failures=0, tokens=10):
    return {
        "solved": solved,
        "moves": moves,
        "optimal_moves": optimal,
        "parse_failures": parse_failures,
        "response_tokens": tokens,
    }


def test_summary_counts_success_moves_and_parse_failures():
    # given two solved episodes (one optimal, one with a detour), a failure with bad replies
    rows = [row(True, 9, 8), row(True, 13, 8), row(False, 15, 10, parse_failures=5)]
    summary = summarize(rows, budget_ceiling=1.0)
    assert summary["n"] == 3 and summary["solved"] == 2
    assert summary["success_rate"] == pytest.approx(2 / 3)
    assert summary["mean_moves_solved"] == pytest.approx(11.0)
    assert summary["moves_over_optimal"] == pytest.approx((1.0 + 12 / 8) / 2), "the final stop is not a move"
    assert summary["parse_failure_rate"] == pytest.approx(5 / 37)
    assert summary["success_ci95"] == pytest.approx(list(wilson_interval(2, 3)))


@pytest.fixture(scope="module")
def local_ray(local_ray_head):
    """This process as a driver of the session's loopback-only head (never a bare ray.init(), which
    listens on every interface and writes an 0644 token into ~/.ray)."""
    from mazerl.cluster.head.driver import ray_driver

    with ray_driver(local_ray_head):
        yield


def test_two_workers_equal_one_worker_maze_by_maze(starter_model_dir, tmp_path, local_ray):
    # given the starter on the first 12 mazes of the embedded set, in chunks of 4
    settings = EvalSettings(eval_set="maze256-small-v1", max_eval_mazes=12, gif_count=2)
    # when evaluated with one worker and with two
    said: list[str] = []
    one = evaluate(starter_model_dir, settings, tmp_path / "one", chunk_size=4, log=said.append)
    two = evaluate(starter_model_dir, replace(settings, eval_workers=2), tmp_path / "two", chunk_size=4)
    assert not said, "the model's own context mode needs no warning"

    # then every maze got the same replies, and the headline numbers agree
    def lines(report):
        return [json.loads(line) for line in report.results_path.read_text().splitlines()]

    for a, b in zip(lines(one), lines(two), strict=True):
        assert (a["index"], a["actions"], a["solved"]) == (b["index"], b["actions"], b["solved"])
    assert [a["index"] for a in lines(one)] == list(range(12)), "results are written in set order"
    assert (one.solved, one.parse_failure_rate) == (two.solved, two.parse_failure_rate)
    # and the files say what the report says
    summary = json.loads(one.summary_path.read_text())
    for key in ("success_rate", "success_ci95", "budget_ceiling", "parse_failure_rate", "episodes_per_second"):
        assert key in summary
    assert summary["n"] == 12 and summary["settings"]["history_images"] == 1, "the starter's recorded setting"
    assert summary["eval_set_digest"] == one.eval_set_digest and len(one.model_digest) == 64
    assert len(one.gif_paths) == 2 and all(p.stat().st_size > 0 for p in one.gif_paths)
    assert EvalReport.from_summary(one.summary_path) == one
    assert {"success_rate", "avg_moves", "parse_failure_rate"} <= set(summary), "what eval logging reads"
    assert one.avg_moves == sum(row["moves"] for row in lines(one)) / 12, "per maze, solved or not"
    assert not list(tmp_path.rglob("*.tmp")), "no temporary files left behind"
    # and a mode the model was not trained in is played as asked, but said loudly and recorded
    other = evaluate(
        starter_model_dir,
        replace(settings, max_eval_mazes=4, history_text=0),
        tmp_path / "other",
        chunk_size=4,
        log=said.append,
    )
    assert len(said) == 1 and "history_text=0" in said[0] and "'tried'" in said[0], said
    summary = json.loads(other.summary_path.read_text())
    assert summary["settings"]["history_text"] == 0 and summary["trained_context_mode"]["history_text"] == "tried"


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"eval_engine": "tensorrt"}, ValueError, "eval_engine"),
        ({"eval_workers": 0}, ValueError, "eval_workers"),
        ({"gif_count": -1}, ValueError, "gif_count"),
        ({"max_eval_mazes": 0}, ValueError, "max_eval_mazes"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"eval_set": "maze9-nope"}, ValueError, "unknown eval set"),
        ({"history_images": 0}, ValueError, "history_images"),
        ({"history_images": 2, "history_text": "feedback"}, ValueError, "history_images: 1"),
    ],
)
def test_bad_eval_arguments_are_refused_before_any_work(starter_model_dir, tmp_path, overrides, error, message):
    settings = EvalSettings(**({"eval_set": "maze256-small-v1"} | overrides))
    with pytest.raises(error, match=message):
        evaluate(starter_model_dir, settings, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "nothing is written for a call that was refused"


def test_a_missing_model_is_refused(tmp_path):
    from mazerl.policy.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="not a directory"):
        evaluate(tmp_path / "missing", EvalSettings(eval_set="maze256-small-v1"), tmp_path / "out")


def test_a_worker_reports_each_maze_as_its_episode_ends_not_each_chunk():
    from mazerl.evaluation.workers import EvalJob, EvalWorker
    from mazerl.starter.shipped import shipped_starter

    class Counter:  # what the eval's driver reads; the Ray actor's ``add.remote`` in-process
        def __init__(self):
            self.adds = []
            self.add = type("Remote", (), {"remote": staticmethod(self.adds.append)})

    # Given a worker playing one chunk of 8 mazes greedily with the shipped starter (it solves some, early),
    settings = EvalSettings(eval_set="maze256-small-v1", gif_count=0, max_new_tokens=12, history_images=1)
    job = EvalJob(str(shipped_starter()), None, replace(settings, history_text="feedback"), "tuple", 1, "cpu")
    counter = Counter()
    result = EvalWorker(job).run(list(range(8)), counter)
    # then its counter heard of the mazes as they ended: one report per episode length, adding up to the chunk.
    lengths = sorted({row["moves"] for row in result.rows})
    ended = [sum(row["moves"] == n for row in result.rows) for n in lengths]
    assert counter.adds == ended, f"episodes of {lengths} moves; reports {counter.adds}"
    assert len(counter.adds) > 1, "some episodes end before others: more than one report per chunk"


def test_eval_command_with_a_dashboard_address_runs_the_eval_as_a_ray_job_there(
    starter_model_dir, local_ray_head, tmp_path, monkeypatch, capsys
):
    """Ray refuses an http:// address in ``ray.init``; ``mazerl eval --ray-address`` goes through Ray's job API."""
    from ray.job_submission import JobSubmissionClient

    from cli.main import main

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(local_ray_head.token_path))
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(starter_model_dir), "--ray-address", local_ray_head.address]
    code = main([*argv, "--max-eval-mazes", "2", "--eval-workers", "1", "--gifs", "0", "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert f"a Ray job on {local_ray_head.address}" in printed.out and "eval done: " in printed.out
    assert "success " in printed.out, "the report is printed as without --ray-address"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and len((out / "results.jsonl").read_text().splitlines()) == 2
    client = JobSubmissionClient(local_ray_head.address, headers=local_ray_head.auth_headers())
    request = out / "request.json"
    jobs = [job for job in client.list_jobs() if str(request) in job.entrypoint]
    assert [(job.status, job.metadata["mazerl_stage"]) for job in jobs] == [("SUCCEEDED", "eval")], "one job ran it"
    assert json.loads(request.read_text())["out_dir"] == str(out.resolve())


def test_eval_workers_that_the_cluster_cannot_place_fail_within_the_bound_naming_the_job_that_holds_it(
    local_ray_head, local_ray
):
    """A baseline eval started while another job holds the cluster used to wait forever for its actors."""
    import time

    from ray.job_submission import JobSubmissionClient

    from mazerl.evaluation.placement import WorkersNotPlaced, reserve_workers

    client = JobSubmissionClient(local_ray_head.address, headers=local_ray_head.auth_headers())
    # Given another job holding both CPUs of the head,
    holder = client.submit_job(entrypoint="sleep 120", entrypoint_num_cpus=2, submission_id=f"holder-{time.time_ns()}")
    try:
        deadline = time.monotonic() + 60
        while str(client.get_job_status(holder)) != "RUNNING":
            assert time.monotonic() < deadline, "the holding job did not start"
            time.sleep(0.5)
        # when an eval asks for a worker of one CPU, it is refused after the wait, naming that job and the fix,
        started = time.monotonic()
        with pytest.raises(
            WorkersNotPlaced, match=rf"not placed within 3 s.*{holder} \(RUNNING\).*ray job stop {holder}"
        ):
            reserve_workers(1, 1, 0, wait_s=3)
        assert time.monotonic() - started < 30
    finally:
        client.stop_job(holder)
    # and once the cluster is free, the same workers are placed.
    deadline = time.monotonic() + 60
    while str(client.get_job_status(holder)) not in ("STOPPED", "SUCCEEDED", "FAILED"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(reserve_workers(1, 1, 0, wait_s=30))


def test_eval_flags_use_the_pipeline_names_and_keep_the_old_ones_as_aliases():
    import argparse

    from cli.eval import add_eval_command

    parser = argparse.ArgumentParser()
    add_eval_command(parser.add_subparsers())
    new = ["eval", "--model", "m", "--eval-engine", "vllm", "--eval-workers", "3", "--max-eval-mazes", "5"]
    old = ["eval", "--model", "m", "--engine", "vllm", "--workers", "3", "--max-mazes", "5"]
    parsed_new, parsed_old = parser.parse_args(new), parser.parse_args(old)
    values = [(parsed.engine, parsed.workers, parsed.max_mazes) for parsed in (parsed_new, parsed_old)]
    assert values == [("vllm", 3, 5)] * 2
    # an error names the flag as the user typed it
    assert (parsed_old.workers_flag, parsed_old.max_mazes_flag, parsed_old.engine_flag) == (
        "--workers",
        "--max-mazes",
        "--engine",
    )
    assert parser.parse_args(["eval", "--model", "m"]).max_mazes_flag == "--max-eval-mazes"


@pytest.mark.parametrize(("typed", "parsed"), [("tried", "tried"), ("feedback", "feedback"), ("all", "all"), ("2", 2)])
def test_eval_history_text_flag_takes_every_context_mode(typed, parsed):
    import argparse

    from cli.eval import add_eval_command

    parser = argparse.ArgumentParser()
    add_eval_command(parser.add_subparsers())
    assert parser.parse_args(["eval", "--model", "m", "--history-text", typed]).history_text == parsed
